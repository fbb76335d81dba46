//! Kernel modules compiled by NVRTC straight to machine code (a cubin for the device's own
//! `sm_XY`, so the driver has no PTX left to compile), and kept in a disk cache so that only the
//! first process on a machine pays for the compilation. A release build made by
//! `scripts/gpu-build.sh` carries the cubins of every module for the common architectures
//! (build.rs, `EMBEDDED_IMAGES`): on those GPUs no process compiles anything.
//!
//! The cache folder is `$SIMJOIN_CACHE_DIR`, else `$XDG_CACHE_HOME/simjoin`, else
//! `~/.cache/simjoin`; images live in its `kernels/` folder. An image's file name is a BLAKE3 hash
//! of everything the machine code depends on (the flattened source, the compile options, the
//! architecture, the NVRTC and driver versions), so a changed source or an upgraded driver never
//! finds a stale image. Each file carries the hash of its own bytes: a truncated or corrupt file is
//! compiled again and replaced. Files are written under a temporary name and renamed into place,
//! so processes starting at once never read a half-written image (the last rename wins; every
//! writer wrote the same bytes). A cache that cannot be read or written only costs the compilation.

use std::ffi::CString;
use std::path::{Path, PathBuf};

use cudarc::nvrtc::{result, sys};

use super::kernels::KernelModule;
use super::{Error, Result};

/// Identifies the file format; bump when the layout changes.
const MAGIC: &[u8; 16] = b"simjoin-cubin-1\n";

use super::kernels::EMBEDDED_IMAGES;
use super::nvrtc_options::nvrtc_options as options;

/// The folder compiled images are kept in, if the environment names one.
pub fn cache_dir() -> Option<PathBuf> {
    crate::options::cache_dir().map(|d| d.join("kernels"))
}

/// Where an image came from: an embedded or cached one the driver refuses is compiled again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageOrigin {
    /// Built into this binary.
    Embedded,
    /// Read from the disk cache.
    Cache,
    /// Compiled by NVRTC in this process.
    Compiled,
}

/// The cubin of `module` for `arch`: when `read_stored`, the one built into this binary, else a
/// sound one from the cache; otherwise compiled and stored (replacing any cached one).
/// `driver_version` is `cuDriverGetVersion`'s answer.
pub fn module_image(
    module: KernelModule,
    arch: &str,
    driver_version: i32,
    read_stored: bool,
) -> Result<(Vec<u8>, ImageOrigin)> {
    if let Some(image) = embedded(module, arch).filter(|_| read_stored) {
        return Ok((image.to_vec(), ImageOrigin::Embedded));
    }
    let path = cache_dir().map(|dir| dir.join(file_name(module, arch, driver_version)));
    if let Some(image) = path.as_deref().filter(|_| read_stored).and_then(read_image) {
        return Ok((image, ImageOrigin::Cache));
    }
    let image = compile(module, arch)?;
    if let Some(path) = &path {
        // Best effort: a read-only or full disk only means the next process compiles too.
        let _ = write_image(path, &image);
    }
    Ok((image, ImageOrigin::Compiled))
}

/// The image of `module` for `arch` built into this binary, if any.
fn embedded(module: KernelModule, arch: &str) -> Option<&'static [u8]> {
    EMBEDDED_IMAGES.iter().find(|(file, a, _)| *file == module.file_name() && *a == arch).map(|&(_, _, image)| image)
}

/// Why no kernel can be had for `arch`, if so: this binary carries none for it and NVRTC, which
/// would compile them, is not installed.
pub fn no_kernels_for(arch: &str) -> Option<String> {
    let carried = EMBEDDED_IMAGES.iter().any(|&(_, a, _)| a == arch);
    (!carried && !nvrtc_present()).then(|| {
        format!(
            "the CUDA runtime compiler library (libnvrtc) was not found, and this binary carries no kernels for {arch}"
        )
    })
}

/// Whether NVRTC can be loaded (cudarc panics on the first call into a missing library).
fn nvrtc_present() -> bool {
    // SAFETY: only tries to dlopen() libnvrtc.
    unsafe { sys::is_culib_present() }
}

/// The architectures this binary carries machine code for (`simjoin selftest` says whether the
/// GPU's is among them).
pub fn embedded_archs() -> Vec<&'static str> {
    let mut archs: Vec<&str> = EMBEDDED_IMAGES.iter().map(|&(_, arch, _)| arch).collect();
    archs.dedup();
    archs
}

/// Whether this binary or the cache holds an image of `module` for this architecture and driver
/// (an estimate for `device=auto`: loading checks the image).
pub fn is_cached(module: KernelModule, arch: &str, driver_version: i32) -> bool {
    embedded(module, arch).is_some()
        || cache_dir().is_some_and(|dir| dir.join(file_name(module, arch, driver_version)).is_file())
}

/// Whether this binary or the cache holds an image of `module` for some architecture (before the
/// device is open).
pub fn any_cached(module: KernelModule) -> bool {
    if EMBEDDED_IMAGES.iter().any(|(file, _, _)| *file == module.file_name()) {
        return true;
    }
    let stem = format!("{}-", module.file_name().trim_end_matches(".cu"));
    let Some(entries) = cache_dir().and_then(|dir| std::fs::read_dir(dir).ok()) else { return false };
    entries.flatten().any(|e| e.file_name().to_str().is_some_and(|n| n.starts_with(&stem) && n.ends_with(".cubin")))
}

fn file_name(module: KernelModule, arch: &str, driver_version: i32) -> String {
    let mut key = blake3::Hasher::new();
    for part in [module.source(), &options(arch).join(" "), arch, &nvrtc_version(), &driver_version.to_string()] {
        // Length-prefixed, so no two different inputs hash the same bytes.
        key.update(&(part.len() as u64).to_le_bytes());
        key.update(part.as_bytes());
    }
    let stem = module.file_name().trim_end_matches(".cu");
    format!("{stem}-{arch}-{}.cubin", &key.finalize().to_hex()[..32])
}

fn nvrtc_version() -> String {
    if !nvrtc_present() {
        return "absent".to_string();
    }
    let (mut major, mut minor) = (0, 0);
    // SAFETY: nvrtcVersion writes two ints through valid pointers; the library is present.
    let status = unsafe { sys::nvrtcVersion(&mut major, &mut minor) };
    match status.result() {
        Ok(()) => format!("{major}.{minor}"),
        Err(_) => "unknown".to_string(),
    }
}

/// The image stored at `path` if the file is whole: its magic, its hash, then the cubin.
fn read_image(path: &Path) -> Option<Vec<u8>> {
    let bytes = std::fs::read(path).ok()?;
    let rest = bytes.strip_prefix(MAGIC.as_slice())?;
    let (hash, image) = rest.split_at_checked(32)?;
    (!image.is_empty() && blake3::hash(image).as_bytes() == hash).then(|| image.to_vec())
}

fn write_image(path: &Path, image: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().ok_or_else(|| std::io::Error::other("no cache folder"))?;
    std::fs::create_dir_all(dir)?;
    let temporary = dir.join(format!(
        ".{}.{}.{}",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("image"),
        std::process::id(),
        rand::random::<u64>()
    ));
    let mut contents = Vec::with_capacity(MAGIC.len() + 32 + image.len());
    contents.extend_from_slice(MAGIC);
    contents.extend_from_slice(blake3::hash(image).as_bytes());
    contents.extend_from_slice(image);
    std::fs::write(&temporary, &contents)?;
    std::fs::rename(&temporary, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&temporary);
    })
}

/// NVRTC's cubin of `module` for `arch` (a real architecture, `sm_XY`, so NVRTC runs the
/// assembler itself and the driver loads machine code).
fn compile(module: KernelModule, arch: &str) -> Result<Vec<u8>> {
    // A built-in image the driver refused lands here too, where NVRTC need not be installed
    // (`no_kernels_for` checks it only for architectures without built-in images).
    if !nvrtc_present() {
        return Err(Error::Device(format!(
            "cannot compile {} for {arch}: the CUDA runtime compiler library (libnvrtc) was not found",
            module.file_name()
        )));
    }
    let failed = |what: &str, e: result::NvrtcError| Error::Device(format!("NVRTC {what} {}: {e}", module.file_name()));
    let source = CString::new(module.source()).map_err(|_| Error::Device("a kernel source holds a NUL byte".into()))?;
    let name = CString::new(module.file_name()).map_err(|_| Error::Device("a kernel name holds a NUL byte".into()))?;
    let program = result::create_program(&source, Some(&name)).map_err(|e| failed("could not load", e))?;
    let compiled = (|| {
        // SAFETY: `program` was created above and is destroyed only after this closure.
        if let Err(e) = unsafe { result::compile_program(program, &options(arch)) } {
            // SAFETY: as above; the log is NUL-terminated by NVRTC.
            let log = unsafe { result::get_program_log(program) }
                .map(|log| {
                    let bytes: Vec<u8> = log.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
                    String::from_utf8_lossy(&bytes).into_owned()
                })
                .unwrap_or_default();
            return Err(Error::Device(format!("NVRTC could not compile {}: {e}\n{log}", module.file_name())));
        }
        let mut size = 0usize;
        // SAFETY: `program` compiled successfully; `size` is a valid out-pointer.
        unsafe { sys::nvrtcGetCUBINSize(program, &mut size) }.result().map_err(|e| failed("has no cubin for", e))?;
        let mut image = vec![0u8; size];
        // SAFETY: `image` holds the `size` bytes NVRTC reported for this program's cubin.
        unsafe { sys::nvrtcGetCUBIN(program, image.as_mut_ptr().cast()) }
            .result()
            .map_err(|e| failed("has no cubin for", e))?;
        Ok(image)
    })();
    // SAFETY: created above, destroyed once.
    let _ = unsafe { result::destroy_program(program) };
    compiled
}

#[cfg(test)]
mod tests {
    use super::{file_name, read_image, write_image};
    use crate::cuda::kernels::KernelModule;

    #[test]
    fn a_cached_image_is_read_back_only_while_whole() {
        let dir = std::env::temp_dir().join(format!("simjoin-cubin-test-{}", std::process::id()));
        let path = dir.join("module.cubin");
        let image = vec![7u8; 1000];
        write_image(&path, &image).unwrap();
        assert_eq!(read_image(&path).as_deref(), Some(image.as_slice()));
        // Truncated (a crash mid-write of an older writer, a full disk): refused.
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() - 1]).unwrap();
        assert_eq!(read_image(&path), None);
        // One byte flipped: refused.
        let mut flipped = bytes.clone();
        *flipped.last_mut().unwrap() ^= 1;
        std::fs::write(&path, &flipped).unwrap();
        assert_eq!(read_image(&path), None);
        // No temporary files left behind.
        let leftovers = std::fs::read_dir(&dir).unwrap().count();
        assert_eq!(leftovers, 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_key_changes_with_the_architecture_and_the_driver() {
        let a = file_name(KernelModule::Knn, "sm_90a", 13000);
        assert_ne!(a, file_name(KernelModule::Knn, "sm_80", 13000));
        assert_ne!(a, file_name(KernelModule::Knn, "sm_90a", 13010));
        assert_ne!(a, file_name(KernelModule::BruteJoin, "sm_90a", 13000));
        assert!(a.starts_with("knn-sm_90a-") && a.ends_with(".cubin"), "{a}");
    }
}
