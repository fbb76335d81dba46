//! `simjoin demo`: writes small seeded datasets as Parquet, then runs one query of each function and
//! prints the answers with their timings.

use std::time::Instant;

use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion::error::Result;
use simjoin::Metric;
use simjoin::datagen::{self, Distribution};

use super::SessionArgs;

pub async fn run(args: SessionArgs) -> Result<()> {
    let dir = std::env::temp_dir().join(format!("simjoin-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let points = datagen::generate(Distribution::Uniform, 200_000, 2, 1);
    // Queries come from the same blobs as the base: the last 1,000 of 101,000 points.
    let mut blobs = datagen::generate(Distribution::Blobs, 101_000, 32, 2);
    let queries = blobs.split_off(100_000 * 32);
    datagen::write(&points, 2, &dir.join("points.parquet"))?;
    datagen::write(&blobs, 32, &dir.join("blobs.parquet"))?;
    datagen::write(&queries, 32, &dir.join("queries.parquet"))?;
    let eps = datagen::calibrate_threshold(&points, 2, 20.0, Metric::L2, 4);
    let radius = datagen::calibrate_threshold(&blobs, 32, 50.0, Metric::L2, 5);

    let mut session = args.clone();
    for name in ["points", "blobs", "queries"] {
        session.tables.push(format!("{name}={}", dir.join(format!("{name}.parquet")).display()));
    }
    let ctx = super::sql::session(&session).await?;
    let words = WORDS.iter().enumerate().map(|(i, w)| format!("({i}, '{w}')")).collect::<Vec<_>>().join(", ");
    ctx.sql(&format!("CREATE TABLE words AS SELECT * FROM (VALUES {words}) AS t(id, word)")).await?.collect().await?;
    println!("simjoin demo: data in {}", dir.display());
    println!(
        "  points: 200,000 uniform 2-D; blobs: 100,000 × 32-D Gaussian blobs; queries: 1,000 × 32-D; words: {} spellings\n",
        WORDS.len()
    );

    let steps = [
        (
            format!("ε self-join of points, eps = {eps:.6} (≈20 neighbours per point)"),
            format!(
                "SELECT count(*) AS pairs, min(distance) AS closest, avg(distance) AS mean FROM sim_join(points, {eps})"
            ),
        ),
        (
            "the first pairs".to_string(),
            format!(
                "SELECT left_id, right_id, distance FROM sim_join(points, {eps}) ORDER BY left_id, right_id LIMIT 5"
            ),
        ),
        (
            format!("range query: blobs within r = {radius:.4} of each query"),
            format!(
                "SELECT count(*) AS matches, count(DISTINCT query_id) AS queries_with_matches FROM range_query(blobs, queries, {radius})"
            ),
        ),
        (
            "kNN: the 3 nearest blobs of the first 2 queries, cosine".to_string(),
            "SELECT query_id, rank, base_id, distance FROM knn(blobs, queries, 3, 'metric=cosine') \
             WHERE query_id < 2 ORDER BY query_id, rank"
                .to_string(),
        ),
        (
            "kNN of all 1,000 queries, k = 10 (l2)".to_string(),
            "SELECT count(*) AS rows, max(distance) AS farthest_10th FROM knn(blobs, queries, 10)".to_string(),
        ),
        (
            "plain SQL: a join on l2_distance, planned as sim_join".to_string(),
            format!(
                "SELECT count(*) AS pairs FROM points a JOIN points b ON l2_distance(a.vector, b.vector) <= {eps} AND a.id < b.id"
            ),
        ),
        (
            "text: pairs of words within 1 edit (Levenshtein)".to_string(),
            "SELECT left_word, right_word, distance FROM sim_join(words, 1, 'metric=levenshtein, pairs=unordered') \
             ORDER BY left_word, right_word"
                .to_string(),
        ),
        (
            "text: the 3 closest words to 'recieve'".to_string(),
            "SELECT rank, base_word, distance FROM knn(words, ['recieve'], 3, 'metric=levenshtein') ORDER BY rank"
                .to_string(),
        ),
    ];
    for (title, query) in steps {
        println!("-- {title}\n{query}");
        let started = Instant::now();
        let batches = ctx.sql(&query).await?.collect().await?;
        let elapsed = started.elapsed();
        println!("{}", pretty_format_batches(&batches)?);
        println!("({:.3} s)\n", elapsed.as_secs_f64());
    }
    let plan = ctx.sql(&format!("EXPLAIN SELECT count(*) FROM sim_join(points, {eps})")).await?.collect().await?;
    println!("-- the plan\n{}", pretty_format_batches(&plan)?);
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}

/// Spellings for the text steps: words and their common misspellings.
const WORDS: [&str; 16] = [
    "receive",
    "recieve",
    "deceive",
    "believe",
    "beleive",
    "achieve",
    "acheive",
    "colour",
    "color",
    "neighbour",
    "neighbor",
    "separate",
    "seperate",
    "definitely",
    "definately",
    "relieve",
];
