//! Synthetic datasets with fixed seeds (uniform, exponential λ = 40 as in the GPU-Join papers,
//! Gaussian blobs), their Arrow/Parquet/CSV forms, and ε calibrated to a target neighbour count.

use std::fmt;
use std::fs::File;
use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, FixedSizeListArray, Float32Array, Float64Array, Int64Array, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field};
use datafusion::common::{DataFusionError, Result, exec_err};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution as _, Exp, Normal};

use crate::op::Metric;

/// How coordinates are drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Distribution {
    /// Uniform in [0, 1) per coordinate.
    Uniform,
    /// Exponential with λ = 40 per coordinate (skewed towards the origin).
    Exponential,
    /// Gaussian blobs: 32 centres uniform in [0, 1)^d, σ = 0.02.
    Blobs,
    /// Standard normal per coordinate (the kNN benchmarks' "Gaussian" data).
    Gaussian,
}

impl FromStr for Distribution {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "uniform" => Ok(Self::Uniform),
            "exponential" | "expo" => Ok(Self::Exponential),
            "blobs" => Ok(Self::Blobs),
            "gaussian" | "normal" => Ok(Self::Gaussian),
            _ => Err(format!("unknown distribution '{s}' (expected uniform, exponential, blobs or gaussian)")),
        }
    }
}

impl fmt::Display for Distribution {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Uniform => "uniform",
            Self::Exponential => "exponential",
            Self::Blobs => "blobs",
            Self::Gaussian => "gaussian",
        })
    }
}

/// `n` seeded strings for testing text metrics: every 23rd NULL, every 23rd (offset 1) empty,
/// every 23rd (offset 2) 60 to `longest` characters long (several 64-character machine words),
/// two in five a copy of an earlier string with up to three edits (so many pairs lie within a few
/// edits), the rest 1–9 random characters; the alphabet has non-ASCII characters (é, 字).
pub fn words(n: usize, longest: usize, seed: u64) -> Vec<Option<String>> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut pick = |m: usize| rng.random_range(0..m.max(1));
    let alphabet: Vec<char> = "abcdeé字".chars().collect();
    let mut out: Vec<Option<String>> = Vec::with_capacity(n);
    for i in 0..n {
        let word = match (i % 23, i % 5) {
            (0, _) => None,
            (1, _) => Some(String::new()),
            (2, _) => Some((0..60 + pick(longest.saturating_sub(59))).map(|_| alphabet[pick(3)]).collect()),
            (_, 0 | 1) if i > 0 => {
                let mut w: Vec<char> = out[pick(i)].clone().unwrap_or_default().chars().collect();
                for _ in 0..pick(4) {
                    let c = alphabet[pick(alphabet.len())];
                    match pick(3) {
                        0 if !w.is_empty() => {
                            let at = pick(w.len());
                            w[at] = c;
                        }
                        1 if !w.is_empty() => {
                            w.remove(pick(w.len()));
                        }
                        _ => w.insert(pick(w.len() + 1), c),
                    }
                }
                Some(w.into_iter().collect())
            }
            _ => Some((0..1 + pick(9)).map(|_| alphabet[pick(alphabet.len())]).collect()),
        };
        out.push(word);
    }
    out
}

/// `n × dim` coordinates, row-major. Values are rounded to f32 so that Parquet (Float32 lists) and
/// CSV forms of a dataset hold the same numbers.
pub fn generate(distribution: Distribution, n: usize, dim: usize, seed: u64) -> Vec<f64> {
    let mut rng = StdRng::seed_from_u64(seed);
    let round = |x: f64| x as f32 as f64;
    match distribution {
        Distribution::Uniform => (0..n * dim).map(|_| round(rng.random::<f64>())).collect(),
        Distribution::Exponential => {
            let exp = Exp::new(40.0).expect("λ = 40 is positive");
            (0..n * dim).map(|_| round(exp.sample(&mut rng))).collect()
        }
        Distribution::Gaussian => {
            let normal = Normal::new(0.0, 1.0).expect("σ = 1 is positive");
            (0..n * dim).map(|_| round(normal.sample(&mut rng))).collect()
        }
        Distribution::Blobs => {
            let centres: Vec<f64> = (0..32 * dim).map(|_| rng.random::<f64>()).collect();
            let noise = Normal::new(0.0, 0.02).expect("σ = 0.02 is positive");
            let mut out = Vec::with_capacity(n * dim);
            for _ in 0..n {
                let c = rng.random_range(0..32);
                for d in 0..dim {
                    out.push(round(centres[c * dim + d] + noise.sample(&mut rng)));
                }
            }
            out
        }
    }
}

/// A batch with `id` (Int64, 0-based) and `vector` (FixedSizeList<Float32>), the Parquet layout.
pub fn vector_batch(values: &[f64], dim: usize) -> Result<RecordBatch> {
    let n = values.len() / dim;
    let item = Arc::new(Field::new("item", DataType::Float32, false));
    let flat = Float32Array::from(values.iter().map(|&v| v as f32).collect::<Vec<_>>());
    let list = FixedSizeListArray::try_new(item, dim as i32, Arc::new(flat), None)?;
    Ok(RecordBatch::try_from_iter([
        ("id", Arc::new(Int64Array::from_iter_values(0..n as i64)) as ArrayRef),
        ("vector", Arc::new(list) as ArrayRef),
    ])?)
}

/// A batch with `id` and one Float64 column per coordinate, `x1..xd`, the CSV layout.
pub fn column_batch(values: &[f64], dim: usize) -> Result<RecordBatch> {
    let n = values.len() / dim;
    let mut columns: Vec<(String, ArrayRef)> = vec![("id".into(), Arc::new(Int64Array::from_iter_values(0..n as i64)))];
    for d in 0..dim {
        let column: Float64Array = (0..n).map(|i| values[i * dim + d]).collect::<Vec<_>>().into();
        columns.push((format!("x{}", d + 1), Arc::new(column)));
    }
    Ok(RecordBatch::try_from_iter(columns)?)
}

/// Rows per Parquet row group at most: readers decode row groups in parallel (DataFusion one per
/// core), so a file of one large group decodes on one thread.
const ROW_GROUP_ROWS: usize = 65536;
/// Bytes per row group at most: wide vectors (Fashion-MNIST's 784 values a row) get groups of
/// fewer rows, and so as many groups to decode in parallel as narrow ones.
const ROW_GROUP_BYTES: usize = 8 << 20;

/// Plain encoding (no dictionary): the values of vectors rarely repeat, and where they do (the
/// 256 grey levels of Fashion-MNIST's pixels) a dictionary makes the file 4x smaller but its
/// decoding several times slower per value, and fewer, larger row groups under the byte limit.
fn writer_properties() -> parquet::file::properties::WriterProperties {
    parquet::file::properties::WriterProperties::builder()
        .set_max_row_group_row_count(Some(ROW_GROUP_ROWS))
        .set_max_row_group_bytes(Some(ROW_GROUP_BYTES))
        .set_dictionary_enabled(false)
        .build()
}

/// Writes `batch` a few thousand rows at a time: the writer checks the byte limit of a row group
/// between writes only.
fn write_in_slices(writer: &mut parquet::arrow::ArrowWriter<File>, batch: &RecordBatch) -> Result<()> {
    const SLICE_ROWS: usize = 4096;
    for start in (0..batch.num_rows()).step_by(SLICE_ROWS) {
        writer.write(&batch.slice(start, SLICE_ROWS.min(batch.num_rows() - start)))?;
    }
    Ok(())
}

/// Writes a dataset to `path`: Parquet (vector column) or CSV (x1..xd columns), by extension.
pub fn write(values: &[f64], dim: usize, path: &Path) -> Result<()> {
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("").to_ascii_lowercase();
    let file =
        File::create(path).map_err(|e| DataFusionError::Execution(format!("cannot create {}: {e}", path.display())))?;
    match ext.as_str() {
        "parquet" => {
            let batch = vector_batch(values, dim)?;
            let mut writer = parquet::arrow::ArrowWriter::try_new(file, batch.schema(), Some(writer_properties()))?;
            write_in_slices(&mut writer, &batch)?;
            writer.close()?;
        }
        "csv" => {
            let batch = column_batch(values, dim)?;
            let mut writer = datafusion::arrow::csv::Writer::new(file);
            writer.write(&batch)?;
        }
        _ => return exec_err!("cannot write '{}': use a .parquet or .csv file name", path.display()),
    }
    Ok(())
}

/// Writes labelled vectors as Parquet: `id`, `label` (Int64) and `vector` (FixedSizeList<Float32>).
pub fn write_labelled(images: &LabelledImages, dim: usize, path: &Path) -> Result<()> {
    let batch = vector_batch(&images.pixels, dim)?;
    let labels: ArrayRef = Arc::new(Int64Array::from_iter_values(images.labels.iter().map(|&l| l as i64)));
    let batch = RecordBatch::try_from_iter([
        ("id", batch.column(0).clone()),
        ("label", labels),
        ("vector", batch.column(1).clone()),
    ])?;
    let file =
        File::create(path).map_err(|e| DataFusionError::Execution(format!("cannot create {}: {e}", path.display())))?;
    let mut writer = parquet::arrow::ArrowWriter::try_new(file, batch.schema(), Some(writer_properties()))?;
    write_in_slices(&mut writer, &batch)?;
    writer.close()?;
    Ok(())
}

/// The threshold at which a point has about `target` neighbours on average: the `target / (n − 1)`
/// quantile of distances between random pairs (enough pairs for ~400 below it, at most 2·10⁷),
/// moved midway to the next sampled distance.
pub fn calibrate_threshold(values: &[f64], dim: usize, target: f64, metric: Metric, seed: u64) -> f64 {
    let n = values.len() / dim;
    if n < 2 {
        return 0.0;
    }
    let q = (target / (n - 1) as f64).min(1.0);
    let pairs = ((400.0 / q) as usize).clamp(100_000, 20_000_000);
    let mut rng = StdRng::seed_from_u64(seed);
    let mut distances: Vec<f64> = (0..pairs)
        .map(|_| {
            let (i, j) = (rng.random_range(0..n), rng.random_range(0..n));
            metric.distance(&values[i * dim..(i + 1) * dim], &values[j * dim..(j + 1) * dim])
        })
        .collect();
    let at = ((q * pairs as f64) as usize).min(pairs - 2);
    let (_, below, above) = distances.select_nth_unstable_by(at, f64::total_cmp);
    let below = *below;
    // Midway to the next sampled distance: a threshold equal to a sampled pair's distance would put
    // that pair exactly on the boundary, where peers that compare squared distances disagree.
    let next = above.iter().copied().fold(f64::INFINITY, f64::min);
    if next.is_finite() && next > below { below + (next - below) / 2.0 } else { below }
}

/// Where Debian's `dataset-fashion-mnist` package puts the IDX files.
pub const FASHION_MNIST_DIR: &str = "/usr/share/datasets/fashion-mnist";

/// One Fashion-MNIST split: `n × 784` pixel values (0–255, as f64) and the class of each image.
#[derive(Debug, Clone, PartialEq)]
pub struct LabelledImages {
    /// Row-major pixels, 784 per image.
    pub pixels: Vec<f64>,
    /// Class (0–9) per image.
    pub labels: Vec<u8>,
}

/// Reads `{prefix}-images-idx3-ubyte.gz` and `{prefix}-labels-idx1-ubyte.gz` from `dir` (the
/// ann-benchmarks split: `train` is the 60,000-image base, `t10k` the 10,000 queries).
pub fn read_fashion_mnist(dir: &Path, prefix: &str) -> Result<LabelledImages> {
    let read = |name: String| -> Result<Vec<u8>> {
        let path = dir.join(&name);
        let file = File::open(&path)
            .map_err(|e| DataFusionError::Execution(format!("cannot open {}: {e}", path.display())))?;
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(file), &mut bytes)
            .map_err(|e| DataFusionError::Execution(format!("cannot decompress {}: {e}", path.display())))?;
        Ok(bytes)
    };
    let be = |b: &[u8], at: usize| u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]) as usize;
    let images = read(format!("{prefix}-images-idx3-ubyte.gz"))?;
    let labels = read(format!("{prefix}-labels-idx1-ubyte.gz"))?;
    if images.len() < 16 || be(&images, 0) != 0x0803 || labels.len() < 8 || be(&labels, 0) != 0x0801 {
        return exec_err!("{}: not Fashion-MNIST IDX files (bad magic numbers)", dir.display());
    }
    let (n, rows, cols) = (be(&images, 4), be(&images, 8), be(&images, 12));
    if images.len() != 16 + n * rows * cols || labels.len() != 8 + n || be(&labels, 4) != n {
        return exec_err!("{}: {prefix} IDX files are truncated or disagree on the image count", dir.display());
    }
    Ok(LabelledImages { pixels: images[16..].iter().map(|&p| p as f64).collect(), labels: labels[8..].to_vec() })
}

#[cfg(test)]
mod tests {
    use std::fs::File;
    use std::path::Path;

    use super::{Distribution, FASHION_MNIST_DIR, calibrate_threshold, generate, read_fashion_mnist, write};
    use crate::op::Metric;

    #[test]
    fn generation_is_seeded() {
        for d in [Distribution::Uniform, Distribution::Exponential, Distribution::Blobs, Distribution::Gaussian] {
            assert_eq!(generate(d, 10, 3, 1), generate(d, 10, 3, 1));
            assert_ne!(generate(d, 10, 3, 1), generate(d, 10, 3, 2));
        }
    }

    #[test]
    fn parquet_files_have_row_groups_to_decode_in_parallel() {
        let dir = std::env::temp_dir().join(format!("simjoin-datagen-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let groups = |n: usize, dim: usize| {
            let path = dir.join(format!("{n}-{dim}.parquet"));
            write(&generate(Distribution::Uniform, n, dim, 1), dim, &path).unwrap();
            let file = File::open(&path).unwrap();
            let reader = parquet::file::reader::SerializedFileReader::new(file).unwrap();
            parquet::file::reader::FileReader::metadata(&reader).num_row_groups()
        };
        // Narrow rows: groups of 65,536 rows; wide rows: groups of at most 32 MiB.
        assert_eq!(groups(200_000, 2), 4);
        assert!(groups(30_000, 784) >= 3);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn fashion_mnist_reads_when_installed() {
        let dir = Path::new(FASHION_MNIST_DIR);
        if !dir.exists() {
            return; // Debian's dataset-fashion-mnist is not installed here
        }
        let test = read_fashion_mnist(dir, "t10k").unwrap();
        assert_eq!((test.labels.len(), test.pixels.len()), (10_000, 10_000 * 784));
        assert!(test.labels.iter().all(|&l| l < 10));
        assert!(read_fashion_mnist(dir, "nope").is_err());
    }

    #[test]
    fn calibration_hits_the_target_roughly() {
        let v = generate(Distribution::Uniform, 20_000, 2, 3);
        let eps = calibrate_threshold(&v, 2, 50.0, Metric::L2, 4);
        // Expected neighbours of a uniform 2-D point: n·π·ε² (ignoring the border).
        let expected = 20_000.0 * std::f64::consts::PI * eps * eps;
        assert!((35.0..70.0).contains(&expected), "eps {eps} gives {expected}");
    }
}
