//! The self-test's clusterings: `dbscan` with its joins on the GPU against the cores, over blobs
//! of points, words and 64-bit hashes (labels and core flags must be identical).

use datafusion::error::Result;
use datafusion::prelude::SessionContext;

use crate::datagen::{self, Distribution};
use crate::selftest::data::{register, register_batch, text_batch};
use crate::selftest::{Cases, compare};

/// `dbscan` of `table` as rows the comparison reads: (id, cluster or −1, core as 0/1).
fn labelled(table: &str, eps: f64, min_points: usize, options: &str) -> String {
    format!(
        "SELECT id, coalesce(cluster_id, -1), CAST(core AS DOUBLE) FROM dbscan({table}, {eps:?}, {min_points}, '{options}')"
    )
}

/// Clusterings of blobs under three metrics and of words by edit distance.
pub(super) async fn clusters(ctx: &SessionContext, cases: &mut Cases) -> Result<usize> {
    let mut failures = 0;
    let values = datagen::generate(Distribution::Blobs, 20_000, 2, 41);
    register(ctx, "a", &values, 2)?;
    for metric in ["l2", "l1", "linf"] {
        for (eps, min_points) in [(0.002, 4), (0.005, 10), (0.002, 1)] {
            failures +=
                compare(ctx, &labelled("a", eps, min_points, &format!("metric={metric}")), "blobs | 20000 × 2", cases)
                    .await?;
        }
    }
    let values = datagen::generate(Distribution::Blobs, 8_000, 16, 42);
    register(ctx, "a", &values, 16)?;
    failures += compare(ctx, &labelled("a", 0.05, 5, "metric=l2"), "blobs | 8000 × 16", cases).await?;
    let words = datagen::words(3000, 40, 43);
    register_batch(ctx, "a", text_batch(&words)?)?;
    for (eps, min_points) in [(1.0, 1), (2.0, 4)] {
        failures += compare(ctx, &labelled("a", eps, min_points, "metric=levenshtein"), "words | 3000", cases).await?;
    }
    Ok(failures)
}
