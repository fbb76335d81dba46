//! The GPU's answers against the cores' on every case of `simjoin selftest`, where a GPU is usable.
//! Without one the test passes and says it was skipped, unless `SIMJOIN_REQUIRE_GPU=1`, which makes
//! a missing GPU a failure. The cases run in a `simjoin selftest` process of their own: they set
//! process-wide switches (a forced division of runs between the GPU and the cores, the GPU's
//! approximate search forced) that the other tests of this process must not see.
//! `SIMJOIN_SELFTEST_ONLY` runs only the cases whose name contains it; `SIMJOIN` names the binary
//! (by default the one cargo built with this test).

use std::io::Write;
use std::process::Command;

#[test]
fn gpu_answers_equal_the_cpu_answers() {
    let required = std::env::var("SIMJOIN_REQUIRE_GPU").is_ok_and(|v| v == "1");
    if let Err(reason) = simjoin::internal::gpu_probe() {
        assert!(!required, "SIMJOIN_REQUIRE_GPU=1, but no GPU is usable: {reason}");
        // Straight to stderr, past the test harness's capture: a skip should be seen.
        let _ = writeln!(std::io::stderr(), "gpu_answers_equal_the_cpu_answers: skipped: no usable GPU ({reason})");
        return;
    }
    let binary = std::env::var("SIMJOIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_simjoin").to_string());
    let mut selftest = Command::new(&binary);
    selftest.arg("selftest");
    if let Ok(only) = std::env::var("SIMJOIN_SELFTEST_ONLY") {
        selftest.args(["--only", &only]);
    }
    let status = selftest.status().unwrap_or_else(|e| panic!("cannot run {binary}: {e}"));
    assert!(status.success(), "{binary} selftest failed: its table above names the cases that differ");
}
