//! Multicurves indexes kept on disk across processes (`simjoin.index_store`), so that a base read
//! from files pays the index's build once: the next process over the same vectors loads it.
//!
//! What is kept: each curve's order (its keys, the base position of each, and the span of its
//! coordinates), the graph's edges where the graph was built, and the efforts calibrated for
//! recall targets. Everything else of the index (the principal axes, the projections, the
//! curves' copies of the leading coordinates) is recomputed from the base on load: the build is
//! deterministic, so that is the stored index bit for bit, at a small share of the build's cost
//! (the curves' keys and sorts and the graph are most of it; docs/approx.md, "Kept across
//! processes").
//!
//! A file's name is a BLAKE3 hash of the vectors themselves (their dimension, type and every
//! value, so any file, object or table holding the same vectors finds it and a changed one never
//! does), the geometry, the build's parameters and this crate's version (a new release may build
//! differently). Each file carries the hash of its own bytes: a truncated, corrupt or foreign file
//! is detected, built again and replaced, never trusted, and its positions and edges are checked
//! to lie within the base besides. Files are written under a temporary name and renamed into
//! place, so processes running at once never read a half-written index. The folder is bounded
//! ([`STORE_BYTES`]): the least recently used files go first. A store that cannot be read or
//! written only costs the build.

use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use super::curve_keys::CurveOrder;
use super::curves::{Calibration, Geometry, Multicurves};
use super::graph::NeighbourGraph;
use crate::vectors::{Values, Vectors};

/// Identifies the file format; bump when the layout changes.
const MAGIC: &[u8; 16] = b"simjoin-index-1\n";
/// Bytes before the payload: the magic, the key, the payload's hash and its length.
const HEADER: usize = 16 + 32 + 32 + 8;
/// Bytes of index files a store keeps; past it the least recently used are removed.
pub const STORE_BYTES: u64 = 16 << 30;
/// Bases smaller than this are not stored: their index builds in milliseconds.
pub const STORE_MIN_ROWS: usize = 16_384;

/// A folder of stored indexes.
#[derive(Debug, Clone)]
pub struct IndexStore {
    dir: PathBuf,
}

/// What [`IndexStore::load`] found.
#[derive(Debug)]
pub enum Loaded {
    /// A sound file for these vectors: the index, with its graph where one was stored.
    Index(Multicurves),
    /// No file for these vectors.
    Missing,
    /// A file that is not a sound index of these vectors (removed).
    Unsound(String),
}

impl IndexStore {
    /// The store `setting` names (`simjoin.index_store`): `auto` for the cache folder
    /// (`$SIMJOIN_CACHE_DIR`, else `$XDG_CACHE_HOME/simjoin`, else `~/.cache/simjoin`; its
    /// `indexes/` folder), `off` (or empty) for none, or a folder.
    pub fn from_setting(setting: &str) -> Option<Self> {
        let dir = match setting.trim() {
            "" | "off" => return None,
            "auto" => crate::options::cache_dir()?.join("indexes"),
            dir => PathBuf::from(dir),
        };
        Some(Self { dir })
    }

    /// The folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The stored index of `base` in `geometry` under `key` ([`key`] of them), where one is stored
    /// and sound.
    pub fn load(&self, base: &Vectors, geometry: Geometry, key: &blake3::Hash) -> Loaded {
        let path = self.path(key);
        let Ok(bytes) = std::fs::read(&path) else { return Loaded::Missing };
        match parse(&bytes, key, base.len()) {
            Ok(stored) => {
                let mut orders = Some(stored.orders);
                let mut fitted = true;
                let index = Multicurves::build_with(base, geometry, |inputs| {
                    let orders = orders.take().unwrap_or_default();
                    // The stored orders are of this base's curves (the key says so); a mismatch
                    // of shape would be a bug, answered by ordering afresh.
                    if orders.len() == super::curves::CURVES && orders.iter().all(|o| o.low.len() == inputs.dims) {
                        orders
                    } else {
                        fitted = false;
                        super::curve_keys::order_on_cores(inputs)
                    }
                });
                if !fitted {
                    let _ = std::fs::remove_file(&path);
                    return Loaded::Unsound(format!("{}: curves of another shape", path.display()));
                }
                if let Some(graph) = stored.graph {
                    index.graph(|_| graph);
                }
                for (name, calibration) in stored.calibrations {
                    index.keep_calibration(name, calibration);
                }
                // Marks it used, for the store's bound.
                if let Ok(file) = std::fs::File::options().append(true).open(&path) {
                    let _ = file.set_modified(SystemTime::now());
                }
                Loaded::Index(index)
            }
            Err(why) => {
                let _ = std::fs::remove_file(&path);
                Loaded::Unsound(format!("{}: {why}", path.display()))
            }
        }
    }

    /// Stores `index` under `key` (its base's [`key`]), replacing what was stored for it, then
    /// removes the least recently used files past [`STORE_BYTES`].
    pub fn save(&self, key: &blake3::Hash, index: &Multicurves) -> std::io::Result<()> {
        std::fs::create_dir_all(&self.dir)?;
        let path = self.path(key);
        let staging = self.dir.join(format!(".{}.{}.tmp", key.to_hex(), std::process::id()));
        let written = write(&staging, key, index).and_then(|()| std::fs::rename(&staging, &path));
        if written.is_err() {
            let _ = std::fs::remove_file(&staging);
        }
        written?;
        self.bound(&path);
        Ok(())
    }

    fn path(&self, key: &blake3::Hash) -> PathBuf {
        self.dir.join(format!("{}.index", key.to_hex()))
    }

    /// Removes the least recently used index files (never `keep`) until the rest fit
    /// [`STORE_BYTES`].
    fn bound(&self, keep: &Path) {
        let Ok(entries) = std::fs::read_dir(&self.dir) else { return };
        let mut files: Vec<(SystemTime, u64, PathBuf)> = entries
            .filter_map(|e| e.ok())
            .filter(|e| e.path().extension().is_some_and(|x| x == "index"))
            .filter_map(|e| {
                let meta = e.metadata().ok()?;
                Some((meta.modified().ok()?, meta.len(), e.path()))
            })
            .collect();
        let mut total: u64 = files.iter().map(|f| f.1).sum();
        files.sort();
        for (_, bytes, path) in files {
            if total <= STORE_BYTES {
                break;
            }
            if path != keep && std::fs::remove_file(&path).is_ok() {
                total -= bytes;
            }
        }
    }
}

/// What the index of `base` in `geometry` is stored under: a hash of every value and of what
/// decides the build (it reads the whole base: computed once a run).
pub fn key(base: &Vectors, geometry: Geometry) -> blake3::Hash {
    let mut hasher = blake3::Hasher::new();
    hasher.update(MAGIC);
    hasher.update(env!("CARGO_PKG_VERSION").as_bytes());
    hasher.update(super::curves::build_parameters().as_bytes());
    hasher.update(&[geometry as u8]);
    hasher.update(&(base.dim as u64).to_le_bytes());
    hasher.update(&(base.len() as u64).to_le_bytes());
    match &base.values {
        // blake3's hasher is a writer: the values go in as they would go to a file.
        Values::F32(values) => {
            hasher.update(b"f32");
            put(&mut hasher, values, f32::to_le_bytes)
        }
        Values::F64(values) => {
            hasher.update(b"f64");
            put(&mut hasher, values, f64::to_le_bytes)
        }
    }
    .expect("a hasher's writes cannot fail");
    hasher.finalize()
}

/// Writes `values` as their bytes (`bytes` of each), a block at a time.
fn put<T: Copy, const N: usize>(out: &mut impl Write, values: &[T], bytes: fn(T) -> [u8; N]) -> std::io::Result<()> {
    let mut block = vec![0u8; 1 << 16];
    for chunk in values.chunks((1 << 16) / N) {
        for (slot, &x) in block.chunks_exact_mut(N).zip(chunk) {
            slot.copy_from_slice(&bytes(x));
        }
        out.write_all(&block[..chunk.len() * N])?;
    }
    Ok(())
}

/// A writer that hashes what it writes.
struct Hashing<W> {
    inner: W,
    hasher: blake3::Hasher,
    written: u64,
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(bytes)?;
        self.hasher.update(&bytes[..n]);
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Writes `index` to `path`: the header (its hash and length filled in last), then the payload.
fn write(path: &Path, key: &blake3::Hash, index: &Multicurves) -> std::io::Result<()> {
    let mut file = std::fs::File::create(path)?;
    file.write_all(&[0u8; HEADER])?;
    let mut out = Hashing { inner: BufWriter::with_capacity(1 << 20, file), hasher: blake3::Hasher::new(), written: 0 };
    put(&mut out, &[index.len() as u64, index.dim() as u64, index.curve_count() as u64], u64::to_le_bytes)?;
    for c in 0..index.curve_count() {
        let (low, high, keys, positions) = index.curve_order(c);
        put(&mut out, &[low.len() as u64], u64::to_le_bytes)?;
        put(&mut out, low, f32::to_le_bytes)?;
        put(&mut out, high, f32::to_le_bytes)?;
        put(&mut out, keys, u64::to_le_bytes)?;
        put(&mut out, positions, u32::to_le_bytes)?;
    }
    match index.built_graph() {
        Some(graph) => {
            out.write_all(&[1])?;
            put(&mut out, graph.edges(), u32::to_le_bytes)?;
        }
        None => out.write_all(&[0])?,
    }
    let calibrations = index.calibrations();
    out.write_all(&(calibrations.len() as u64).to_le_bytes())?;
    for (name, Calibration { effort, found, truth }) in calibrations {
        out.write_all(&(name.len() as u64).to_le_bytes())?;
        out.write_all(name.as_bytes())?;
        out.write_all(&effort.unwrap_or(f64::NAN).to_le_bytes())?;
        out.write_all(&found.to_le_bytes())?;
        out.write_all(&truth.to_le_bytes())?;
    }
    out.flush()?;
    let Hashing { inner, hasher, written } = out;
    let mut file = inner.into_inner().map_err(|e| e.into_error())?;
    file.seek(SeekFrom::Start(0))?;
    file.write_all(MAGIC)?;
    file.write_all(key.as_bytes())?;
    file.write_all(hasher.finalize().as_bytes())?;
    file.write_all(&written.to_le_bytes())?;
    file.sync_all()
}

/// A stored index's parts.
struct Stored {
    orders: Vec<CurveOrder>,
    graph: Option<NeighbourGraph>,
    calibrations: Vec<(String, Calibration)>,
}

/// Reads a stored index of `len` rows under `key` from `bytes`, checking everything.
fn parse(bytes: &[u8], key: &blake3::Hash, len: usize) -> Result<Stored, String> {
    if bytes.len() < HEADER || &bytes[..16] != MAGIC {
        return Err("not an index file of this format".into());
    }
    if &bytes[16..48] != key.as_bytes() {
        return Err("stored for other vectors".into());
    }
    let payload = &bytes[HEADER..];
    let stated = u64::from_le_bytes(bytes[80..88].try_into().expect("8 bytes"));
    if stated != payload.len() as u64 || blake3::hash(payload).as_bytes() != &bytes[48..80] {
        return Err("truncated or corrupt (its hash differs)".into());
    }
    let mut at = Reader { bytes: payload, at: 0 };
    let (rows, _dim, curves) = (at.u64()? as usize, at.u64()?, at.u64()? as usize);
    if rows != len || curves != super::curves::CURVES {
        return Err(format!("{rows} rows and {curves} curves, for a base of {len}"));
    }
    let mut orders = Vec::with_capacity(curves);
    for _ in 0..curves {
        let dims = at.u64()? as usize;
        if dims > super::curve_keys::MAX_CURVE_DIMS {
            return Err(format!("a curve of {dims} dimensions"));
        }
        let low = at.f32s(dims)?;
        let high = at.f32s(dims)?;
        let keys = at.words(len, u64::from_le_bytes)?;
        let positions: Vec<u32> = at.u32s(len)?;
        if positions.iter().any(|&p| p as usize >= len) {
            return Err("a curve lists a row past the base".into());
        }
        orders.push(CurveOrder { low, high, keys, positions });
    }
    let graph = match at.take(1)?[0] {
        0 => None,
        _ => Some(
            NeighbourGraph::from_edges(at.u32s(len * super::graph::WIDTH)?, len)
                .ok_or("an edge names a row past the base")?,
        ),
    };
    let mut calibrations = Vec::new();
    for _ in 0..at.u64()? {
        let name_len = at.u64()? as usize;
        let name = String::from_utf8(at.take(name_len)?.to_vec()).map_err(|_| "a calibration's name is not UTF-8")?;
        let effort = f64::from_le_bytes(at.take(8)?.try_into().expect("8"));
        let (found, truth) = (at.u64()?, at.u64()?);
        calibrations.push((name, Calibration { effort: (!effort.is_nan()).then_some(effort), found, truth }));
    }
    if at.at != payload.len() {
        return Err("bytes after the index".into());
    }
    Ok(Stored { orders, graph, calibrations })
}

/// A cursor over a payload.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self.at.checked_add(n).filter(|&end| end <= self.bytes.len()).ok_or("ends early")?;
        let taken = &self.bytes[self.at..end];
        self.at = end;
        Ok(taken)
    }

    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }

    /// `n` values of `N` bytes each, read by `from`.
    fn words<T: Copy + Default, const N: usize>(&mut self, n: usize, from: fn([u8; N]) -> T) -> Result<Vec<T>, String> {
        let bytes = self.take(n.checked_mul(N).ok_or("a length past memory")?)?;
        let mut values = vec![T::default(); n];
        // Sized reads into a sized vector: the loop compiles to a copy.
        for (value, word) in values.iter_mut().zip(bytes.chunks_exact(N)) {
            *value = from(word.try_into().expect("N bytes"));
        }
        Ok(values)
    }

    fn u32s(&mut self, n: usize) -> Result<Vec<u32>, String> {
        self.words(n, u32::from_le_bytes)
    }

    fn f32s(&mut self, n: usize) -> Result<Vec<f32>, String> {
        self.words(n, f32::from_le_bytes)
    }
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};

    use super::{IndexStore, Loaded, key};
    use crate::backend::cpu::approx::build_graph;
    use crate::index::curves::{Calibration, Geometry, Multicurves};
    use crate::vectors::Vectors;

    fn base(n: usize, seed: u64) -> Vectors {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        Vectors::new(12, (0..n * 12).map(|_| rng.random::<f64>()).collect())
    }

    #[test]
    fn a_stored_index_loads_as_built_and_a_damaged_one_is_refused() {
        let dir = std::env::temp_dir().join(format!("simjoin-store-test-{}", std::process::id()));
        let store = IndexStore::from_setting(dir.to_str().unwrap()).unwrap();
        let vectors = base(3000, 1);
        let (raw, unit) = (key(&vectors, Geometry::Raw), key(&vectors, Geometry::Unit));
        assert!(matches!(store.load(&vectors, Geometry::Raw, &raw), Loaded::Missing));
        let built = Multicurves::build(&vectors, Geometry::Raw);
        built.graph(build_graph);
        built.keep_calibration(
            "cpu, l2, k=10, recall=0.95".into(),
            Calibration { effort: Some(2.0), found: 9, truth: 10 },
        );
        store.save(&raw, &built).unwrap();
        let Loaded::Index(loaded) = store.load(&vectors, Geometry::Raw, &raw) else { panic!("not loaded") };
        for c in 0..built.curve_count() {
            assert_eq!(loaded.curve(c), built.curve(c));
        }
        assert_eq!(loaded.built_graph().unwrap().edges(), built.built_graph().unwrap().edges());
        assert_eq!(loaded.calibrations(), built.calibrations());
        for i in [0, 1234, 2999] {
            assert_eq!(loaded.projected(i), built.projected(i));
        }
        // Other vectors find nothing; a flipped byte is refused and removed.
        let other = base(3000, 2);
        assert!(matches!(store.load(&other, Geometry::Raw, &key(&other, Geometry::Raw)), Loaded::Missing));
        assert!(matches!(store.load(&vectors, Geometry::Unit, &unit), Loaded::Missing));
        let file = std::fs::read_dir(&dir).unwrap().next().unwrap().unwrap().path();
        let mut bytes = std::fs::read(&file).unwrap();
        let middle = bytes.len() / 2;
        bytes[middle] ^= 1;
        std::fs::write(&file, &bytes).unwrap();
        assert!(matches!(store.load(&vectors, Geometry::Raw, &raw), Loaded::Unsound(_)));
        assert!(matches!(store.load(&vectors, Geometry::Raw, &raw), Loaded::Missing));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn settings_name_the_cache_folder_none_or_a_folder() {
        assert!(IndexStore::from_setting("off").is_none());
        assert!(IndexStore::from_setting("").is_none());
        assert_eq!(IndexStore::from_setting("/tmp/x").unwrap().dir(), std::path::Path::new("/tmp/x"));
    }
}
