//! A progress bar (indicatif) for similarity operators that run longer than a second.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use simjoin::ProgressListener;

/// Shows a bar on stderr once a run has lasted a second; silent before that and when stderr is not
/// a terminal.
#[derive(Debug, Default)]
pub struct Bar {
    current: Mutex<Option<Running>>,
}

#[derive(Debug)]
struct Running {
    bar: ProgressBar,
    started: Instant,
    shown: bool,
}

const SHOW_AFTER: Duration = Duration::from_secs(1);

impl ProgressListener for Bar {
    fn start(&self, function: &str, total: u64) {
        let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::hidden());
        if let Ok(style) = ProgressStyle::with_template("{msg} [{elapsed_precise}] {wide_bar} {percent}% (eta {eta})") {
            bar.set_style(style);
        }
        bar.set_message(function.to_string());
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) =
            Some(Running { bar, started: Instant::now(), shown: false });
    }

    fn advance(&self, units: u64) {
        if let Some(run) = self.current.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
            run.bar.inc(units);
            if !run.shown && run.started.elapsed() > SHOW_AFTER {
                run.bar.set_draw_target(ProgressDrawTarget::stderr());
                run.shown = true;
            }
        }
    }

    fn finish(&self) {
        if let Some(run) = self.current.lock().unwrap_or_else(|e| e.into_inner()).take() {
            run.bar.finish_and_clear();
        }
    }
}
