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
