// NVRTC's options, shared with build.rs (`include!`), so an image embedded in a release build and
// one compiled at run time come from the same options.

/// The compile options every module is built with, for a real architecture (`sm_XY`, so NVRTC runs
/// the assembler itself and the driver loads machine code).
pub fn nvrtc_options(arch: &str) -> Vec<String> {
    vec![
        format!("--gpu-architecture={arch}"),
        // Two roundings for `a * b + c`, as on the CPU: exact distances stay bit-identical.
        "--fmad=false".to_string(),
        "-std=c++17".to_string(),
    ]
}
