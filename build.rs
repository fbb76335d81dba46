//! Embeds the CUDA kernels: each `kernels/*.cu` with its local `#include "x.cuh"` inlined (once
//! each, with `#line` markers so NVRTC errors point at the real file) becomes a string constant in
//! `OUT_DIR/kernel_sources.rs`. No CUDA toolkit is needed here: kernels are compiled at run time by
//! NVRTC on the GPU machine.

use std::collections::HashSet;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

fn main() {
    println!("cargo::rerun-if-changed=kernels");
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let mut sources: Vec<PathBuf> = fs::read_dir("kernels")
        .expect("kernels/ exists")
        .map(|e| e.expect("readable kernels/ entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "cu"))
        .collect();
    sources.sort();
    let mut constants = String::new();
    for source in &sources {
        let mut seen = HashSet::new();
        let text = flatten(source, &mut seen);
        let name = source.file_stem().and_then(|s| s.to_str()).expect("UTF-8 kernel file name");
        let flat = out_dir.join(format!("{name}.cu"));
        fs::write(&flat, text).expect("OUT_DIR is writable");
        writeln!(
            constants,
            "/// `kernels/{name}.cu`, includes inlined.\npub const {}: &str = include_str!(concat!(env!(\"OUT_DIR\"), \"/{name}.cu\"));",
            name.to_ascii_uppercase()
        )
        .expect("writing to a String");
    }
    fs::write(out_dir.join("kernel_sources.rs"), constants).expect("OUT_DIR is writable");
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
