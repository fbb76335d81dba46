//! With the `gpu` feature, embeds the CUDA kernels: each `kernels/*.cu` with its local
//! `#include "x.cuh"` inlined (once each, with `#line` markers so NVRTC errors point at the real
//! file) becomes a string constant in `OUT_DIR/kernel_sources.rs`. No CUDA toolkit is needed here: kernels are compiled at run time by
//! NVRTC on the GPU machine.
//!
//! A release build for GPU machines can also embed their machine code: with `SIMJOIN_NVRTC` naming
//! an NVRTC library (`libnvrtc.so.13`), every module is compiled here for each architecture of
//! `SIMJOIN_EMBED_ARCHS` (a comma-separated list; default `EMBEDDED_ARCHS`), and a process on such
//! a GPU loads those images instead of compiling (`src/cuda/compile.rs`). `scripts/gpu-build.sh`
//! does this with NVRTC 13.0, whose cubins every CUDA 13 driver loads.

use std::collections::HashSet;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

include!("src/cuda/nvrtc_options.rs");

/// The architectures embedded when `SIMJOIN_EMBED_ARCHS` does not list them: every one the device
/// layer names (`arch_for` in src/cuda/device.rs) whose tensor cores the kernels use (m16n8k16 needs
/// sm_80), Ampere to Blackwell.
const EMBEDDED_ARCHS: &[&str] = &["sm_80", "sm_86", "sm_87", "sm_89", "sm_90a", "sm_100", "sm_103", "sm_120"];

fn main() {
    // Without the `gpu` feature no module includes the kernels.
    if std::env::var_os("CARGO_FEATURE_GPU").is_none() {
        println!("cargo::rerun-if-changed=build.rs");
        return;
    }
    println!("cargo::rerun-if-changed=kernels");
    println!("cargo::rerun-if-changed=src/cuda/nvrtc_options.rs");
    println!("cargo::rerun-if-env-changed=SIMJOIN_NVRTC");
    println!("cargo::rerun-if-env-changed=SIMJOIN_EMBED_ARCHS");
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let mut sources: Vec<PathBuf> = fs::read_dir("kernels")
        .expect("kernels/ exists")
        .map(|e| e.expect("readable kernels/ entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "cu"))
        .collect();
    sources.sort();
    let mut constants = String::new();
    let mut flattened = Vec::new();
    for source in &sources {
        let mut seen = HashSet::new();
        let text = flatten(source, &mut seen);
        let name = source.file_stem().and_then(|s| s.to_str()).expect("UTF-8 kernel file name");
        let flat = out_dir.join(format!("{name}.cu"));
        fs::write(&flat, &text).expect("OUT_DIR is writable");
        flattened.push((name.to_string(), text));
        writeln!(
            constants,
            "/// `kernels/{name}.cu`, includes inlined.\npub const {}: &str = include_str!(concat!(env!(\"OUT_DIR\"), \"/{name}.cu\"));",
            name.to_ascii_uppercase()
        )
        .expect("writing to a String");
    }
    constants.push_str(&embedded_images(&flattened, &out_dir));
    fs::write(out_dir.join("kernel_sources.rs"), constants).expect("OUT_DIR is writable");
}

/// The `EMBEDDED_IMAGES` constant: each (module, architecture) compiled by the NVRTC that
/// `SIMJOIN_NVRTC` names, several at once; empty without it.
fn embedded_images(sources: &[(String, String)], out_dir: &Path) -> String {
    let mut constant = String::from(
        "/// Machine code compiled when this binary was built: (source file, architecture, cubin).\n\
         pub const EMBEDDED_IMAGES: &[(&str, &str, &[u8])] = &[\n",
    );
    let Some(library) = std::env::var_os("SIMJOIN_NVRTC").filter(|v| !v.is_empty()) else {
        return constant + "];\n";
    };
    let archs: Vec<String> = match std::env::var("SIMJOIN_EMBED_ARCHS") {
        Ok(list) => list.split(',').map(|a| a.trim().to_string()).filter(|a| !a.is_empty()).collect(),
        Err(_) => EMBEDDED_ARCHS.iter().map(|a| a.to_string()).collect(),
    };
    let nvrtc = Nvrtc::open(Path::new(&library));
    let jobs: Vec<(&str, &str, &str)> = archs
        .iter()
        .flat_map(|arch| sources.iter().map(move |(name, text)| (name.as_str(), text.as_str(), arch.as_str())))
        .collect();
    let next = AtomicUsize::new(0);
    let failures = Mutex::new(Vec::new());
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                while let Some(&(name, text, arch)) = jobs.get(next.fetch_add(1, Ordering::Relaxed)) {
                    match nvrtc.compile(&format!("{name}.cu"), text, arch) {
                        Ok(cubin) => {
                            fs::write(out_dir.join(format!("{name}-{arch}.cubin")), cubin).expect("OUT_DIR is writable")
                        }
                        Err(log) => failures.lock().expect("no thread panicked").push(log),
                    }
                }
            });
        }
    });
    let failures = failures.into_inner().expect("no thread panicked");
    assert!(failures.is_empty(), "embedding kernels with {}:\n{}", library.to_string_lossy(), failures.join("\n"));
    for (name, _, arch) in &jobs {
        writeln!(
            constant,
            "    (\"{name}.cu\", \"{arch}\", include_bytes!(concat!(env!(\"OUT_DIR\"), \"/{name}-{arch}.cubin\"))),"
        )
        .expect("writing to a String");
    }
    constant + "];\n"
}

/// The few NVRTC entry points compiling a program to a cubin needs, from a library loaded by path.
struct Nvrtc {
    library: libloading::Library,
    /// NVRTC opens its builtins library by name; PyPI's NVRTC 13.0 does not look beside itself.
    _builtins: Vec<libloading::Library>,
}

type Program = *mut std::ffi::c_void;

impl Nvrtc {
    fn open(path: &Path) -> Self {
        let beside = path.parent().and_then(|dir| fs::read_dir(dir).ok()).into_iter().flatten().flatten();
        let builtins = beside
            .map(|entry| entry.path())
            .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("libnvrtc-builtins.so")))
            // SAFETY: loading NVRTC's builtins runs only its library initialisers.
            .filter_map(|p| unsafe { libloading::Library::new(p) }.ok())
            .collect();
        // SAFETY: as above, for NVRTC.
        let library = unsafe { libloading::Library::new(path) }
            .unwrap_or_else(|e| panic!("SIMJOIN_NVRTC={}: cannot load NVRTC: {e}", path.display()));
        Self { library, _builtins: builtins }
    }

    fn symbol<T>(&self, name: &str) -> libloading::Symbol<'_, T> {
        // SAFETY: each caller names T as the C signature of `name` in NVRTC's header (nvrtc.h).
        unsafe { self.library.get(name.as_bytes()) }.unwrap_or_else(|e| panic!("NVRTC lacks {name}: {e}"))
    }

    /// The cubin of `source` for `arch`, or NVRTC's log of why not.
    fn compile(&self, name: &str, source: &str, arch: &str) -> Result<Vec<u8>, String> {
        use std::ffi::{CString, c_char, c_int};
        type Create = unsafe extern "C" fn(
            *mut Program,
            *const c_char,
            *const c_char,
            c_int,
            *const *const c_char,
            *const *const c_char,
        ) -> c_int;
        type Compile = unsafe extern "C" fn(Program, c_int, *const *const c_char) -> c_int;
        type Size = unsafe extern "C" fn(Program, *mut usize) -> c_int;
        type Bytes = unsafe extern "C" fn(Program, *mut c_char) -> c_int;
        type Destroy = unsafe extern "C" fn(*mut Program) -> c_int;
        let c_source = CString::new(source).expect("kernel sources hold no NUL byte");
        let c_name = CString::new(name).expect("kernel names hold no NUL byte");
        let options: Vec<CString> =
            nvrtc_options(arch).into_iter().map(|o| CString::new(o).expect("options hold no NUL byte")).collect();
        let option_pointers: Vec<*const c_char> = options.iter().map(|o| o.as_ptr()).collect();
        let mut program: Program = std::ptr::null_mut();
        // SAFETY: the pointers are valid NUL-terminated strings that outlive the calls, `program`
        // is created before use and destroyed once, and each buffer holds the size NVRTC reported.
        unsafe {
            if self.symbol::<Create>("nvrtcCreateProgram")(
                &mut program,
                c_source.as_ptr(),
                c_name.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            ) != 0
            {
                return Err(format!("{name} for {arch}: nvrtcCreateProgram failed"));
            }
            let compiled = self.symbol::<Compile>("nvrtcCompileProgram")(
                program,
                option_pointers.len() as c_int,
                option_pointers.as_ptr(),
            );
            let (size_of, bytes_of) = if compiled == 0 {
                ("nvrtcGetCUBINSize", "nvrtcGetCUBIN")
            } else {
                ("nvrtcGetProgramLogSize", "nvrtcGetProgramLog")
            };
            let mut size = 0usize;
            let mut bytes = Vec::new();
            if self.symbol::<Size>(size_of)(program, &mut size) == 0 {
                bytes = vec![0u8; size];
                if self.symbol::<Bytes>(bytes_of)(program, bytes.as_mut_ptr().cast()) != 0 {
                    bytes.clear();
                }
            }
            self.symbol::<Destroy>("nvrtcDestroyProgram")(&mut program);
            match (compiled, bytes.is_empty()) {
                (0, false) => Ok(bytes),
                (0, true) => Err(format!("{name} for {arch}: NVRTC returned no cubin")),
                _ => Err(format!("{name} for {arch}:\n{}", String::from_utf8_lossy(&bytes).trim_end_matches('\0'))),
            }
        }
    }
}

/// The file with each local `#include "x.cuh"` replaced by that file's (flattened) text, once.
fn flatten(path: &Path, seen: &mut HashSet<PathBuf>) -> String {
    let text = fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let mut out = format!("#line 1 \"{}\"\n", path.display());
    for (number, line) in text.lines().enumerate() {
        let include = line.trim().strip_prefix("#include \"").and_then(|rest| rest.strip_suffix('"'));
        match include {
            Some(header) => {
                let header_path = path.parent().unwrap_or(Path::new(".")).join(header);
                if seen.insert(header_path.clone()) {
                    out.push_str(&flatten(&header_path, seen));
                    writeln!(out, "#line {} \"{}\"", number + 2, path.display()).expect("writing to a String");
                }
            }
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out
}
