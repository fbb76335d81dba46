//! Files as arguments: Parquet (vector column) and CSV (x1..xd columns) written by `simjoin gen`'s
//! library code, read by path without registration, with the same answers as registered tables.

use datafusion::arrow::array::AsArray;
use datafusion::arrow::datatypes::Int64Type;
use simjoin::datagen::{self, Distribution};

use crate::common::{ctx, rows};

#[tokio::test(flavor = "multi_thread")]
async fn parquet_and_csv_paths_give_the_same_answers() {
    let dir = std::env::temp_dir().join(format!("simjoin-files-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let values = datagen::generate(Distribution::Exponential, 2000, 3, 9);
    let parquet = dir.join("points.parquet");
    let csv = dir.join("points.csv");
    datagen::write(&values, 3, &parquet).unwrap();
    datagen::write(&values, 3, &csv).unwrap();
    let eps = datagen::calibrate_threshold(&values, 3, 10.0, simjoin::Metric::L2, 1);

    let ctx = ctx();
    let from_parquet =
        rows(&ctx, &format!("SELECT left_id, right_id, distance FROM sim_join('{}', {eps:?})", parquet.display()))
            .await;
    let from_csv =
        rows(&ctx, &format!("SELECT left_id, right_id, distance FROM sim_join('{}', {eps:?})", csv.display())).await;
    assert!(from_parquet.len() > 2000, "{}", from_parquet.len());
    assert_eq!(from_parquet, from_csv);

    ctx.register_parquet("points", parquet.to_str().unwrap(), Default::default()).await.unwrap();
    let registered = rows(&ctx, &format!("SELECT left_id, right_id, distance FROM sim_join(points, {eps:?})")).await;
    assert_eq!(registered, from_parquet);

    // The CSV's columns are id, x1, x2, x3: the three float columns form the vector.
    let batches = ctx
        .sql(&format!("SELECT base_id, base_id AS again FROM knn('{}', '[0, 0, 0]', 3) ORDER BY rank", csv.display()))
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    let nearest: Vec<i64> =
        batches.iter().flat_map(|b| b.column(1).as_primitive::<Int64Type>().values().to_vec()).collect();
    assert_eq!(nearest.len(), 3);

    let missing = dir.join("missing.parquet");
    let err = crate::common::error(&ctx, &format!("SELECT * FROM sim_join('{}', 0.1)", missing.display())).await;
    assert!(
        err.starts_with(&format!(
            "Error during planning: sim_join: argument 'table': cannot read '{}'",
            missing.display()
        )),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn integer_columns_named_in_the_options_form_the_vector() {
    let dir = std::env::temp_dir().join(format!("simjoin-int-columns-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // Whole-number coordinates (pixels, counts): id, x, y, z all Int64 in the CSV's schema; the
    // same values written as decimals are Float64 columns, which form the vector by default.
    let (csv, decimals) = (dir.join("cells.csv"), dir.join("cells-decimal.csv"));
    let (mut text, mut decimal_text) = (String::from("id,x,y,z\n"), String::from("id,x,y,z\n"));
    for i in 0..300i64 {
        let (x, y, z) = ((i * 7) % 31, (i * 13) % 17, (i * 5) % 23);
        text.push_str(&format!("{i},{x},{y},{z}\n"));
        decimal_text.push_str(&format!("{i},{x}.0,{y}.0,{z}.0\n"));
    }
    std::fs::write(&csv, text).unwrap();
    std::fs::write(&decimals, decimal_text).unwrap();
    let ctx = ctx();
    let query = |path: &std::path::Path, options: &str| {
        format!(
            "SELECT base_id, base_id AS again, distance, rank FROM knn('{}', '[3, 4, 5]', 7{options}) ORDER BY rank",
            path.display()
        )
    };
    let by_columns = rows(&ctx, &query(&csv, ", 'column=x y z'")).await;
    let by_default = rows(&ctx, &query(&decimals, "")).await;
    assert_eq!(by_columns.len(), 7);
    assert_eq!(by_columns, by_default);

    let err =
        crate::common::error(&ctx, &format!("SELECT * FROM knn('{}', '[1, 2]', 1, 'column=x w')", csv.display())).await;
    assert!(err.contains("has no column 'w'"), "{err}");
    let err = crate::common::error(&ctx, &format!("SELECT * FROM knn('{}', '[1, 2, 3]', 1)", csv.display())).await;
    assert!(err.contains("'column=x y z'"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_cli_reads_a_file_named_in_from() {
    let dir = std::env::temp_dir().join(format!("simjoin-url-table-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let parquet = dir.join("points.parquet");
    datagen::write(&datagen::generate(Distribution::Uniform, 120, 2, 3), 2, &parquet).unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_simjoin"))
        .args(["sql", "--format", "csv", &format!("SELECT count(*) AS n FROM '{}'", parquet.display())])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout} {}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.lines().any(|l| l.trim() == "120"), "{stdout}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_cli_writes_parquet_with_the_codec_and_row_groups_asked_for() {
    let dir = std::env::temp_dir().join(format!("simjoin-output-options-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let points = dir.join("points.parquet");
    datagen::write(&datagen::generate(Distribution::Uniform, 2_000, 2, 5), 2, &points).unwrap();
    let pairs = dir.join("pairs.parquet");
    let join = format!("SELECT left_id, right_id, distance FROM sim_join('{}', 0.05)", points.display());
    let simjoin =
        |args: &[&str]| std::process::Command::new(env!("CARGO_BIN_EXE_simjoin")).args(args).output().unwrap();
    let written =
        simjoin(&["sql", "--compression", "snappy", "--row-group-size", "1000", "-o", pairs.to_str().unwrap(), &join]);
    assert!(written.status.success(), "{}", String::from_utf8_lossy(&written.stderr));
    let counted = simjoin(&["sql", "--format", "csv", &format!("SELECT count(*) AS n FROM ({join})")]);
    let expected: i64 = String::from_utf8_lossy(&counted.stdout).lines().nth(1).unwrap().trim().parse().unwrap();
    assert!(expected > 5_000, "{expected} pairs: too few to span several row groups");

    use parquet::file::reader::{FileReader, SerializedFileReader};
    let metadata = SerializedFileReader::new(std::fs::File::open(&pairs).unwrap()).unwrap().metadata().clone();
    let groups = metadata.row_groups();
    assert_eq!(groups.iter().map(|g| g.num_rows()).sum::<i64>(), expected);
    assert!(groups.len() >= (expected as usize).div_ceil(1000), "{} row groups for {expected} rows", groups.len());
    assert!(groups.iter().all(|g| g.num_rows() <= 1000));
    assert!(groups.iter().flat_map(|g| g.columns()).all(|c| c.compression() == parquet::basic::Compression::SNAPPY));

    let refused = simjoin(&["sql", "--compression", "zstd(99)", "SELECT 1"]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success());
    assert!(stderr.contains("--compression") && stderr.contains("zstd(99)"), "{stderr}");
    std::fs::remove_dir_all(&dir).unwrap();
}
