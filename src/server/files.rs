//! The files a served query may touch: local paths only inside the data directories (and the
//! files of the tables the server registered), every other object store only as the server
//! registered it.
//!
//! Every file a query can name — a table function's path argument, `CREATE EXTERNAL TABLE …
//! LOCATION`, `COPY … TO` — is read or written through the session's object store registry, so
//! the server replaces the registry's `file://` store with [`ConfinedFiles`], which checks each
//! path before the local file system sees it. A path is resolved the way the operating system
//! will resolve it (`..` and symbolic links followed, [`std::fs::canonicalize`]) and must then lie
//! inside one of the roots, themselves canonicalised; a path that does not exist yet (a file being
//! written) is resolved through its nearest existing ancestor. Listings are checked by their
//! prefix and again entry by entry, so a symbolic link inside a root that points out of it is
//! neither listed nor read.

use std::fmt;
use std::ops::Range;
use std::path::{Component, Path as FsPath, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::object_store::ObjectStoreRegistry;
use futures::stream::{BoxStream, StreamExt};
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore, PutMultipartOptions,
    PutOptions, PutPayload, PutResult,
};
use url::Url;

/// The directories (or single files) whose contents a served query may read and write.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DataRoots {
    roots: Vec<PathBuf>,
    /// How many of the roots are data directories (the rest are served tables' files).
    data_dirs: usize,
}

impl DataRoots {
    /// Adds a data directory, canonicalised: it must exist.
    pub fn add_data_dir(&mut self, dir: &FsPath) -> Result<()> {
        if !dir.is_dir() {
            return Err(DataFusionError::Configuration(format!(
                "simjoin serve: data directory '{}' is not a directory",
                dir.display()
            )));
        }
        self.data_dirs += 1;
        self.add(dir)
    }

    /// Adds a served table's file or directory, canonicalised: it must exist.
    pub fn add_table_path(&mut self, path: &FsPath) -> Result<()> {
        self.add(path)
    }

    fn add(&mut self, path: &FsPath) -> Result<()> {
        let canonical = std::fs::canonicalize(path).map_err(|e| {
            DataFusionError::Configuration(format!("simjoin serve: data directory '{}': {e}", path.display()))
        })?;
        if !self.roots.contains(&canonical) {
            self.roots.push(canonical);
        }
        Ok(())
    }

    pub fn paths(&self) -> &[PathBuf] {
        &self.roots
    }

    /// Whether `path`, resolved as the file system will resolve it, lies inside a root.
    fn contains(&self, path: &FsPath) -> bool {
        resolve(path).is_some_and(|resolved| self.roots.iter().any(|root| resolved.starts_with(root)))
    }
}

/// `path` with every symbolic link and `..` resolved; for a path that does not exist (yet), its
/// nearest existing ancestor resolved and the rest appended (which then holds no `..`: a `..`
/// below a missing directory cannot be resolved, so such a path is refused).
fn resolve(path: &FsPath) -> Option<PathBuf> {
    if let Ok(canonical) = std::fs::canonicalize(path) {
        return Some(canonical);
    }
    let mut missing = Vec::new();
    let mut ancestor = path;
    loop {
        let name = ancestor.file_name()?;
        missing.push(name.to_owned());
        ancestor = ancestor.parent()?;
        if let Ok(canonical) = std::fs::canonicalize(ancestor) {
            let resolved = missing.iter().rev().fold(canonical, |acc, name| acc.join(name));
            let plain = resolved.components().all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
            return plain.then_some(resolved);
        }
    }
}

/// The local file system, limited to [`DataRoots`].
#[derive(Debug)]
pub struct ConfinedFiles {
    inner: Arc<dyn ObjectStore>,
    roots: Arc<DataRoots>,
}

impl fmt::Display for ConfinedFiles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ConfinedFiles({})", self.inner)
    }
}

impl ConfinedFiles {
    /// `inner` is the registry's local file system store (paths relative to `/`).
    pub fn new(inner: Arc<dyn ObjectStore>, roots: Arc<DataRoots>) -> Self {
        Self { inner, roots }
    }

    fn check(&self, location: &Path) -> object_store::Result<()> {
        check(&self.roots, location)
    }
}

fn local_path(location: &Path) -> PathBuf {
    FsPath::new("/").join(location.as_ref())
}

/// Checks a path or URL a statement names (`COPY … TO`, `CREATE EXTERNAL TABLE … LOCATION`) up
/// front, so that the client learns why; the store checks every access again. URLs of other
/// stores are left to the registry, which has only the server's own.
pub(super) fn check_named_path(roots: &DataRoots, named: &str) -> std::result::Result<(), tonic::Status> {
    let local = match Url::parse(named) {
        Ok(url) if url.scheme() != "file" && url.scheme().len() > 1 => return Ok(()),
        Ok(url) => url.to_file_path().ok(),
        Err(_) => std::path::absolute(named).ok(),
    };
    let Some(path) = local else {
        return Err(tonic::Status::invalid_argument(format!("simjoin server: '{named}' is not a valid path")));
    };
    if roots.contains(&path) {
        return Ok(());
    }
    Err(tonic::Status::permission_denied(format!("simjoin server: '{named}': {}", outside_reason(roots))))
}

fn outside_reason(roots: &DataRoots) -> String {
    if roots.data_dirs == 0 {
        "this server reads only the files of the tables it serves (it was started without --data-dir)".to_string()
    } else {
        let dirs: Vec<String> = roots.paths().iter().map(|p| p.display().to_string()).collect();
        format!("the path is outside the server's data directories ({})", dirs.join(", "))
    }
}

fn check(roots: &DataRoots, location: &Path) -> object_store::Result<()> {
    let path = local_path(location);
    if roots.contains(&path) {
        return Ok(());
    }
    Err(object_store::Error::PermissionDenied {
        path: path.display().to_string(),
        source: outside_reason(roots).into(),
    })
}

#[async_trait]
impl ObjectStore for ConfinedFiles {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.check(location)?;
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.check(location)?;
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> object_store::Result<GetResult> {
        self.check(location)?;
        self.inner.get_opts(location, options).await
    }

    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> object_store::Result<Vec<Bytes>> {
        self.check(location)?;
        self.inner.get_ranges(location, ranges).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        let roots = self.roots.clone();
        let checked = locations.map(move |location| location.and_then(|l| check(&roots, &l).map(|()| l))).boxed();
        self.inner.delete_stream(checked)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let root = Path::default();
        if let Err(e) = self.check(prefix.unwrap_or(&root)) {
            return futures::stream::once(async move { Err(e) }).boxed();
        }
        let roots = self.roots.clone();
        self.inner
            .list(prefix)
            .filter(move |entry| {
                let keep = match entry {
                    Ok(meta) => check(&roots, &meta.location).is_ok(),
                    Err(_) => true,
                };
                futures::future::ready(keep)
            })
            .boxed()
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        let root = Path::default();
        self.check(prefix.unwrap_or(&root))?;
        let mut listing = self.inner.list_with_delimiter(prefix).await?;
        listing.objects.retain(|meta| self.check(&meta.location).is_ok());
        listing.common_prefixes.retain(|p| self.check(p).is_ok());
        Ok(listing)
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> object_store::Result<()> {
        self.check(from)?;
        self.check(to)?;
        self.inner.copy_opts(from, to, options).await
    }
}

/// The session's registry with its `file://` store confined to [`DataRoots`]; other URLs go to
/// the stores the server registered, and no store can be added through it.
#[derive(Debug)]
pub struct ConfinedRegistry {
    inner: Arc<dyn ObjectStoreRegistry>,
    files: Arc<dyn ObjectStore>,
}

impl ConfinedRegistry {
    pub fn new(inner: Arc<dyn ObjectStoreRegistry>, roots: Arc<DataRoots>) -> Result<Self> {
        let local = inner.get_store(&Url::parse("file:///").expect("a valid URL"))?;
        Ok(Self { inner, files: Arc::new(ConfinedFiles::new(local, roots)) })
    }
}

impl ObjectStoreRegistry for ConfinedRegistry {
    /// Queries cannot register stores; the server's own stores are registered before it serves.
    fn register_store(&self, url: &Url, _store: Arc<dyn ObjectStore>) -> Option<Arc<dyn ObjectStore>> {
        self.get_store(url).ok()
    }

    fn get_store(&self, url: &Url) -> Result<Arc<dyn ObjectStore>> {
        if url.scheme() == "file" {
            return Ok(self.files.clone());
        }
        self.inner.get_store(url).map_err(|_| {
            DataFusionError::Configuration(format!(
                "simjoin server: '{url}' is not reachable: this server reads remote object stores only \
                 in the buckets of its --table and --data-dir URLs"
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use std::path::{Path as FsPath, PathBuf};
    use std::sync::Arc;

    use futures::StreamExt;
    use object_store::ObjectStore;
    use object_store::ObjectStoreExt as _;
    use object_store::local::LocalFileSystem;
    use object_store::path::Path;

    use super::{ConfinedFiles, DataRoots};

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("simjoin-confined-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("data/sub")).unwrap();
        std::fs::create_dir_all(dir.join("outside")).unwrap();
        std::fs::write(dir.join("data/sub/in.csv"), "x\n1\n").unwrap();
        std::fs::write(dir.join("outside/secret.csv"), "x\n2\n").unwrap();
        std::os::unix::fs::symlink(dir.join("outside/secret.csv"), dir.join("data/link.csv")).unwrap();
        std::os::unix::fs::symlink(dir.join("outside"), dir.join("data/linkdir")).unwrap();
        dir
    }

    /// The store's location of a local path, as DataFusion's `ListingTableUrl` gives it (`..`
    /// already resolved by the URL, symbolic links not).
    fn location(path: &FsPath) -> Path {
        Path::from(path.to_str().unwrap().trim_start_matches('/'))
    }

    #[tokio::test]
    async fn reads_and_writes_stay_inside_the_roots() {
        let dir = scratch("rw");
        let mut roots = DataRoots::default();
        roots.add_data_dir(&dir.join("data")).unwrap();
        let store = ConfinedFiles::new(Arc::new(LocalFileSystem::new()), Arc::new(roots));

        assert_eq!(store.get(&location(&dir.join("data/sub/in.csv"))).await.unwrap().bytes().await.unwrap(), "x\n1\n");
        store.put(&location(&dir.join("data/new/out.csv")), "y\n".into()).await.unwrap();
        assert!(dir.join("data/new/out.csv").exists());
        let mut upload = store.put_multipart(&location(&dir.join("data/parts.csv"))).await.unwrap();
        upload.put_part("a\n".into()).await.unwrap();
        upload.complete().await.unwrap();
        assert_eq!(std::fs::read_to_string(dir.join("data/parts.csv")).unwrap(), "a\n");

        for refused in ["outside/secret.csv", "data/link.csv", "data/linkdir/secret.csv"] {
            let error = store.get(&location(&dir.join(refused))).await.unwrap_err();
            assert!(matches!(error, object_store::Error::PermissionDenied { .. }), "{refused}: {error}");
        }
        let error = store.put(&location(&dir.join("outside/new.csv")), "z".into()).await.unwrap_err();
        assert!(error.to_string().contains("outside the server's data directories"), "{error}");
        assert!(!dir.join("outside/new.csv").exists());

        // A listing of a root leaves out the links that point out of it.
        let listed: Vec<String> = store
            .list(Some(&location(&dir.join("data"))))
            .map(|m| m.unwrap().location.to_string())
            .collect::<Vec<_>>()
            .await;
        assert!(listed.iter().any(|l| l.ends_with("data/sub/in.csv")), "{listed:?}");
        assert!(!listed.iter().any(|l| l.contains("link")), "{listed:?}");
        let outside: Vec<_> = store.list(Some(&location(&dir.join("outside")))).collect::<Vec<_>>().await;
        assert!(matches!(&outside[..], [Err(object_store::Error::PermissionDenied { .. })]));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn without_roots_no_file_is_reachable() {
        let dir = scratch("none");
        let store = ConfinedFiles::new(Arc::new(LocalFileSystem::new()), Arc::new(DataRoots::default()));
        let error = store.get(&location(&dir.join("data/sub/in.csv"))).await.unwrap_err();
        assert!(error.to_string().contains("without --data-dir"), "{error}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
