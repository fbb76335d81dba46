//! The examples in sql/ run and print exactly their `.out` files (pretty tables of every statement
//! that returns rows). `SIMJOIN_BLESS=1` rewrites the `.out` files after a reviewed change.

use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion::sql::parser::DFParser;

#[tokio::test(flavor = "multi_thread")]
async fn sql_examples_print_their_expected_output() {
    // The directory cargo names when it runs the test, not the one compiled in: a target directory
    // shared between clones (as CI's cache is) keeps a binary built in another clone.
    let manifest_dir = std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_else(|| env!("CARGO_MANIFEST_DIR").into());
    let dir = std::path::Path::new(&manifest_dir).join("sql");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "sql"))
        .collect();
    files.sort();
    assert!(files.len() >= 4);
    for file in files {
        let ctx = simjoin::session_context();
        let text = std::fs::read_to_string(&file).unwrap();
        let mut printed = String::new();
        for statement in DFParser::parse_sql(&text).unwrap() {
            let plan = ctx.state().statement_to_plan(statement).await.unwrap();
            let batches = ctx.execute_logical_plan(plan).await.unwrap().collect().await.unwrap();
            if batches.iter().any(|b| b.num_columns() > 0 && b.num_rows() > 0) {
                printed.push_str(&pretty_format_batches(&batches).unwrap().to_string());
                printed.push('\n');
            }
        }
        let expected_file = file.with_extension("out");
        if std::env::var_os("SIMJOIN_BLESS").is_some() {
            std::fs::write(&expected_file, &printed).unwrap();
        }
        let expected = std::fs::read_to_string(&expected_file).unwrap_or_default();
        assert_eq!(printed, expected, "{}", file.display());
    }
}
