//! Embedding simjoin over your own files: a Parquet file of embeddings written by another tool
//! (here by the `parquet` crate, as pyarrow or Spark would write one), registered as a table, and a
//! kNN join of every question with its nearest documents in SQL.
//!
//! `cargo run --release --example parquet_knn [DOCS.parquet QUESTIONS.parquet]`
//!
//! Without arguments it writes two small files to a temporary folder first.

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, FixedSizeListArray, Float32Array, Int64Array, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::error::Result;
use datafusion::parquet::arrow::ArrowWriter;
use datafusion::prelude::ParquetReadOptions;

/// A Parquet file of `rows` rows `id` (Int64) and `embedding` (FixedSizeList<Float32>, `dim`).
fn write_embeddings(path: &std::path::Path, rows: usize, dim: usize, seed: u64) -> Result<()> {
    let values = simjoin::datagen::generate(simjoin::datagen::Distribution::Uniform, rows, dim, seed);
    let values: Vec<f32> = values.iter().map(|&v| v as f32).collect();
    let item = Arc::new(Field::new("item", DataType::Float32, true));
    let embedding = FixedSizeListArray::try_new(item, dim as i32, Arc::new(Float32Array::from(values)), None)?;
    let ids = Int64Array::from_iter_values(0..rows as i64);
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("embedding", embedding.data_type().clone(), false),
    ]));
    let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(ids) as ArrayRef, Arc::new(embedding)])?;
    let mut writer = ArrowWriter::try_new(std::fs::File::create(path)?, schema, None)?;
    writer.write(&batch)?;
    writer.close()?;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let folder = std::env::temp_dir().join(format!("simjoin-example-{}", std::process::id()));
    let (docs, questions) = match args.as_slice() {
        [docs, questions] => (docs.clone(), questions.clone()),
        _ => {
            std::fs::create_dir_all(&folder)?;
            let (docs, questions) = (folder.join("docs.parquet"), folder.join("questions.parquet"));
            write_embeddings(&docs, 50_000, 96, 1)?;
            write_embeddings(&questions, 100, 96, 2)?;
            (docs.display().to_string(), questions.display().to_string())
        }
    };

    let ctx = simjoin::session_context();
    ctx.register_parquet("docs", &docs, ParquetReadOptions::default()).await?;
    ctx.register_parquet("questions", &questions, ParquetReadOptions::default()).await?;
    // The vector column is the only list column of each file; `column=embedding` names it anyway.
    let sql = "SELECT query_id, base_id, distance, rank FROM knn(docs, questions, 3, 'metric=cosine, column=embedding') \
               WHERE query_id < 2 ORDER BY query_id, rank";
    ctx.sql(sql).await?.show().await?;
    // The same neighbours written as a plain-SQL kNN join, which simjoin plans as the same operator.
    let join = "SELECT q.id AS question, d.id AS doc FROM questions q, docs d \
                QUALIFY ROW_NUMBER() OVER (PARTITION BY q.id ORDER BY cosine_distance(q.embedding, d.embedding)) <= 3";
    let rows: usize = ctx.sql(join).await?.collect().await?.iter().map(RecordBatch::num_rows).sum();
    println!("{rows} (question, document) pairs from the plain-SQL kNN join");
    let _ = std::fs::remove_dir_all(&folder);
    Ok(())
}
