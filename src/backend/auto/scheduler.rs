//! The process's one scheduler of `device=auto` runs (after Teodoro et al.'s response-time-aware
//! scheduling of CPU and GPU work in Hypercurves): it owns two units, the CPU cores and the GPU,
//! and sends each run where it is expected to finish first, counting the work already admitted
//! there, then queues it on that unit.
//!
//! * **Where.** A run comes with the cost model's estimate of its time on each unit
//!   (`backend::auto`), corrected by what earlier runs measured: per unit and operation, the ratio
//!   of measured to predicted time, averaged in log space (so a slow or busy machine is seen as
//!   such within a few runs). It goes to the unit whose queued work plus its own corrected time is
//!   smaller.
//! * **When.** A unit runs one operator at a time (the CPU backend already spreads one run over
//!   every core, the GPU backend one run over the whole device), so time-slicing two runs would
//!   only delay both — except small runs on the CPU: one the cost model puts under
//!   [`SMALL_CPU_RUN`] (before correction: under load the corrections grow with the contention,
//!   not with the run's own work) spends
//!   most of its time in what does not spread over the cores (planning its threads, merging their
//!   results), so up to [`SMALL_CPU_RUNS`] of them run at once, and never beside a larger one.
//!   Waiting runs start shortest predicted first, so a burst of small kNN queries
//!   is not stuck behind one large join; a run that has waited longer than [`STARVATION`] times its
//!   own predicted time (and at least [`STARVATION_FLOOR`]) goes ahead of the shorter ones, so a
//!   large run is delayed but never starved.
//! * **Never stuck.** A run holds its unit until it first hands results to its consumer
//!   ([`Ticket::detach`]): from then on its pace is the consumer's, which may be a client that
//!   stopped reading, or a plan that needs a second run's output before it drains the first's, so
//!   the unit goes to the next run. And a run waits at most [`MAX_WAIT`] plus the predicted work
//!   ahead of it, whatever else happens, then runs anyway.

use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The CPU cores and the GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    Cpu = 0,
    Gpu = 1,
}

/// Operations learned apart: a join's estimate errs differently from a kNN's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Work {
    Join = 0,
    Knn = 1,
}

/// A waiting run may pass shorter ones after waiting this many times its own predicted time.
const STARVATION: f64 = 4.0;
/// ... and at least this long.
const STARVATION_FLOOR: Duration = Duration::from_millis(200);
/// How long a run waits for its unit beyond the predicted work ahead of it before running anyway.
const MAX_WAIT: Duration = Duration::from_secs(2);
/// Weight of the newest measurement in the running correction.
const LEARNING_RATE: f64 = 0.3;
/// The correction stays within these factors of the cost model.
const CORRECTION_RANGE: (f64, f64) = (0.01, 100.0);
/// CPU runs predicted at most this long run several at once ...
const SMALL_CPU_RUN: Duration = Duration::from_millis(10);
/// ... up to this many (docs/design.md#scheduling).
const SMALL_CPU_RUNS: usize = 8;

/// The expected finish of a run on each unit, as the choice saw it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Choice {
    /// Where it goes.
    pub unit: Unit,
    /// Its corrected predicted time on each unit (`None`: no usable GPU).
    pub cpu: Duration,
    pub gpu: Option<Duration>,
    /// Queued work plus its own time, on each unit.
    pub cpu_finish: Duration,
    pub gpu_finish: Option<Duration>,
}

/// Fewest seconds a run takes on the faster unit before its rows are divided between the two
/// (below, a second thread, the copy of the divided input and the slower unit's own fixed costs
/// take about what the division saves).
const DIVIDE_MIN: f64 = 0.05;
/// A division must be expected to finish at least this much sooner than the faster unit alone.
const DIVIDE_GAIN: f64 = 0.85;

impl Choice {
    /// The share of a run's left rows (queries) for the GPU when dividing them between the GPU and
    /// the CPU cores is expected to finish sooner than either alone (`None`: it is not). The GPU's
    /// time is `gpu_fixed` (start-up left, uploads, the run's own overhead: paid whatever its
    /// share) plus its share of the rest; the CPU's is its share of its whole time; each after the
    /// work queued on it. The share makes both finish together:
    /// `q_g + F + s·V = q_c + (1 − s)·T_c`, so `s = (q_c + T_c − q_g − F) / (V + T_c)`.
    pub fn gpu_share(&self, gpu_fixed: Duration) -> Option<f64> {
        let (t_g, finish_g) = (self.gpu?.as_secs_f64(), self.gpu_finish?.as_secs_f64());
        let (t_c, finish_c) = (self.cpu.as_secs_f64(), self.cpu_finish.as_secs_f64());
        let (q_g, q_c) = (finish_g - t_g, finish_c - t_c);
        let fixed = gpu_fixed.as_secs_f64().min(t_g);
        let variable = t_g - fixed;
        if t_g.min(t_c) < DIVIDE_MIN || variable + t_c <= 0.0 {
            return None;
        }
        let share = ((q_c + t_c - q_g - fixed) / (variable + t_c)).clamp(0.0, 1.0);
        let divided = (q_g + fixed + share * variable).max(q_c + (1.0 - share) * t_c);
        (share > 0.0 && share < 1.0 && divided < DIVIDE_GAIN * finish_g.min(finish_c)).then_some(share)
    }
}

#[derive(Debug, Default)]
struct State {
    /// Predicted seconds admitted to each unit and not finished (running or waiting), small CPU
    /// runs apart.
    queued: [f64; 2],
    /// ... and of the small CPU runs, which run [`SMALL_CPU_RUNS`] at once.
    queued_small: f64,
    /// Runs running on each unit (more than one: small CPU runs, or a wait ran out).
    running: [usize; 2],
    /// Small CPU runs among them.
    running_small: usize,
    /// Small CPU runs waiting.
    waiting_small: usize,
    /// Waiting runs: (ticket number, unit, predicted seconds, arrival).
    waiting: Vec<(u64, Unit, f64, Instant)>,
    next_ticket: u64,
    /// ln(measured / predicted) per unit and operation.
    log_correction: [[f64; 2]; 2],
}

/// The scheduler (one per process: [`Scheduler::global`]).
#[derive(Debug, Default)]
pub struct Scheduler {
    state: Mutex<State>,
    changed: Condvar,
}

/// A run admitted to a unit; finishing it (or dropping it, on an error) frees the unit.
#[derive(Debug)]
pub struct Ticket<'a> {
    scheduler: &'a Scheduler,
    unit: Unit,
    work: Work,
    /// A small CPU run (may run beside other small ones).
    small: bool,
    /// Predicted seconds before correction (what the measurement is compared with).
    raw_predicted: f64,
    /// Corrected predicted seconds (what was queued).
    predicted: f64,
    started: Instant,
    /// How long it waited for its unit.
    pub waited: Duration,
    /// The unit was handed on at the run's first hand-off of results.
    detached: std::sync::atomic::AtomicBool,
    done: bool,
}

impl Scheduler {
    /// The process's scheduler. One for every session: it owns the hardware (the cores and the
    /// GPU each compute one large run at a time), which sessions of one process share.
    pub fn global() -> &'static Scheduler {
        static GLOBAL: OnceLock<Scheduler> = OnceLock::new();
        GLOBAL.get_or_init(Scheduler::default)
    }

    /// Where a run of `work` estimated at `cpu` on the CPU cores and `gpu` on the GPU (`None`: no
    /// usable GPU) is expected to finish first.
    pub fn choose(&self, work: Work, cpu: Duration, gpu: Option<Duration>) -> Choice {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let corrected = |unit: Unit, d: Duration| {
            Duration::from_secs_f64(d.as_secs_f64() * state.log_correction[unit as usize][work as usize].exp())
        };
        let cpu_own = corrected(Unit::Cpu, cpu);
        let cpu_finish = cpu_own + Duration::from_secs_f64(state.cpu_ahead());
        let gpu_own = gpu.map(|g| corrected(Unit::Gpu, g));
        let gpu_finish = gpu_own.map(|g| g + Duration::from_secs_f64(state.queued[Unit::Gpu as usize]));
        let unit = match gpu_finish {
            _ if cpu <= SMALL_CPU_RUN && state.small_cpu_place() => Unit::Cpu,
            Some(finish) if finish < cpu_finish => Unit::Gpu,
            _ => Unit::Cpu,
        };
        Choice { unit, cpu: cpu_own, gpu: gpu_own, cpu_finish, gpu_finish }
    }

    /// Queues a run on `unit` and returns once it may start: the unit is free and no waiting run
    /// goes first (shortest predicted first, the starved before all), or it has waited as long as
    /// it may. `raw_predicted` is the cost model's time, `predicted` the corrected one.
    pub fn admit(&self, unit: Unit, work: Work, raw_predicted: Duration, predicted: Duration) -> Ticket<'_> {
        let arrived = Instant::now();
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let number = state.next_ticket;
        state.next_ticket += 1;
        let seconds = predicted.as_secs_f64();
        let small = unit == Unit::Cpu && raw_predicted <= SMALL_CPU_RUN;
        let ahead = Duration::from_secs_f64(match unit {
            Unit::Cpu => state.cpu_ahead(),
            Unit::Gpu => state.queued[unit as usize],
        });
        match small {
            true => state.queued_small += seconds,
            false => state.queued[unit as usize] += seconds,
        }
        state.waiting.push((number, unit, seconds, arrived));
        state.waiting_small += usize::from(small);
        let deadline = arrived + MAX_WAIT + ahead;
        loop {
            let now = Instant::now();
            let running = state.running[unit as usize];
            // Free, or running only small runs with a place left, when this one is small.
            let room =
                running == 0 || (small && running == state.running_small && state.running_small < SMALL_CPU_RUNS);
            if (room && next_for(&state.waiting, unit, now) == Some(number)) || now >= deadline {
                break;
            }
            let wait = deadline.saturating_duration_since(now).min(Duration::from_millis(50));
            state = self.changed.wait_timeout(state, wait).unwrap_or_else(|e| e.into_inner()).0;
        }
        state.waiting.retain(|w| w.0 != number);
        state.waiting_small -= usize::from(small);
        state.running[unit as usize] += 1;
        state.running_small += usize::from(small);
        drop(state);
        self.changed.notify_all();
        Ticket {
            scheduler: self,
            unit,
            work,
            small,
            raw_predicted: raw_predicted.as_secs_f64(),
            predicted: seconds,
            started: Instant::now(),
            waited: arrived.elapsed(),
            detached: Default::default(),
            done: false,
        }
    }

    /// The correction learned for `work` on `unit` (measured ÷ predicted).
    #[cfg(test)]
    fn correction(&self, unit: Unit, work: Work) -> f64 {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).log_correction[unit as usize][work as usize].exp()
    }

    /// Hands `unit` to the next run.
    fn free(&self, unit: Unit, small: bool) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.running[unit as usize] = state.running[unit as usize].saturating_sub(1);
        state.running_small = state.running_small.saturating_sub(usize::from(small));
        drop(state);
        self.changed.notify_all();
    }

    /// Ends a run: its predicted work leaves the queue, its unit is freed unless it was already
    /// (`holding`), and a measured time teaches the correction.
    fn release(
        &self,
        unit: Unit,
        work: Work,
        small: bool,
        predicted: f64,
        holding: bool,
        measured: Option<(f64, f64)>,
    ) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        match small {
            true => state.queued_small = (state.queued_small - predicted).max(0.0),
            false => state.queued[unit as usize] = (state.queued[unit as usize] - predicted).max(0.0),
        }
        if holding {
            state.running[unit as usize] = state.running[unit as usize].saturating_sub(1);
            state.running_small = state.running_small.saturating_sub(usize::from(small));
        }
        if let Some((raw, measured)) = measured.filter(|&(raw, measured)| raw > 0.0 && measured > 0.0) {
            let (low, high) = CORRECTION_RANGE;
            let sample = (measured / raw).clamp(low, high).ln();
            let c = &mut state.log_correction[unit as usize][work as usize];
            *c += LEARNING_RATE * (sample - *c);
        }
        drop(state);
        self.changed.notify_all();
    }
}

impl State {
    /// Predicted seconds of CPU work ahead of a new run: the small runs' shared among the places
    /// they run in at once.
    fn cpu_ahead(&self) -> f64 {
        self.queued[Unit::Cpu as usize] + self.queued_small / SMALL_CPU_RUNS as f64
    }

    /// Whether a small CPU run would start at once: no larger CPU run admitted, and fewer small
    /// ones admitted than run at once. Such a run stays on the cores whatever the GPU's estimate
    /// (Teodoro et al.'s DTAHE: the GPU only when the cores cannot keep up), which a GPU run,
    /// with its fixed costs and one run at a time, could not beat by much.
    fn small_cpu_place(&self) -> bool {
        let waiting = self.waiting.iter().filter(|w| w.1 == Unit::Cpu).count();
        let larger = self.running[Unit::Cpu as usize].saturating_sub(self.running_small)
            + waiting.saturating_sub(self.waiting_small);
        larger == 0 && self.running_small + self.waiting_small < SMALL_CPU_RUNS
    }
}

/// The waiting run on `unit` that goes next: the longest-starved one past its bound, else the
/// shortest predicted (ties by arrival).
fn next_for(waiting: &[(u64, Unit, f64, Instant)], unit: Unit, now: Instant) -> Option<u64> {
    let on_unit = || waiting.iter().filter(move |w| w.1 == unit);
    let starved = on_unit()
        .filter(|w| now.duration_since(w.3) > STARVATION_FLOOR.max(Duration::from_secs_f64(STARVATION * w.2)))
        .min_by_key(|w| w.3);
    starved.or_else(|| on_unit().min_by(|a, b| a.2.total_cmp(&b.2).then(a.3.cmp(&b.3)))).map(|w| w.0)
}

impl Ticket<'_> {
    /// Hands the unit to the next run (once; the run goes on): called at the run's first hand-off
    /// of results, after which the consumer sets its pace.
    pub fn detach(&self) {
        if !self.detached.swap(true, std::sync::atomic::Ordering::AcqRel) {
            self.scheduler.free(self.unit, self.small);
        }
    }

    fn holding(&self) -> bool {
        !self.detached.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Frees the unit and teaches the scheduler the run's measured time.
    pub fn finish(mut self) -> Duration {
        self.done = true;
        let measured = self.started.elapsed();
        self.scheduler.release(
            self.unit,
            self.work,
            self.small,
            self.predicted,
            self.holding(),
            Some((self.raw_predicted, measured.as_secs_f64())),
        );
        measured
    }
}

impl Drop for Ticket<'_> {
    /// A run that failed frees its unit without teaching anything.
    fn drop(&mut self) {
        if !self.done {
            self.scheduler.release(self.unit, self.work, self.small, self.predicted, self.holding(), None);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::{Duration, Instant};

    use super::{Choice, MAX_WAIT, Scheduler, Unit, Work};

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    #[test]
    fn a_run_goes_where_queued_work_plus_its_own_finishes_first() {
        let s = Scheduler::default();
        // Idle: the faster unit.
        assert_eq!(s.choose(Work::Knn, ms(300), Some(ms(100))).unit, Unit::Gpu);
        assert_eq!(s.choose(Work::Knn, ms(300), None).unit, Unit::Cpu);
        // A second of work queued on the GPU: the CPU now finishes first.
        let held = s.admit(Unit::Gpu, Work::Join, ms(1000), ms(1000));
        let choice = s.choose(Work::Knn, ms(300), Some(ms(100)));
        assert_eq!(choice.unit, Unit::Cpu);
        assert_eq!(choice.gpu_finish, Some(ms(1100)));
        drop(held);
        assert_eq!(s.choose(Work::Knn, ms(300), Some(ms(100))).unit, Unit::Gpu);
    }

    fn idle(cpu: u64, gpu: u64) -> Choice {
        Choice { unit: Unit::Gpu, cpu: ms(cpu), gpu: Some(ms(gpu)), cpu_finish: ms(cpu), gpu_finish: Some(ms(gpu)) }
    }

    #[test]
    fn rows_are_divided_so_both_units_finish_together() {
        // Even units, no fixed cost: half each.
        let share = idle(400, 400).gpu_share(ms(0)).unwrap();
        assert!((share - 0.5).abs() < 1e-9, "{share}");
        // The GPU 3× faster: three quarters to it.
        let share = idle(600, 200).gpu_share(ms(0)).unwrap();
        assert!((share - 0.75).abs() < 1e-9, "{share}");
        // A fixed 100 ms of its 400 on the GPU: s = (400 − 100) / (300 + 400).
        let share = idle(400, 400).gpu_share(ms(100)).unwrap();
        assert!((share - 3.0 / 7.0).abs() < 1e-9, "{share}");
        // Work queued on the GPU moves rows to the CPU.
        let busy = Choice { gpu_finish: Some(ms(600)), ..idle(400, 400) };
        assert!(busy.gpu_share(ms(0)).unwrap() < 0.5);
    }

    #[test]
    fn small_or_lopsided_runs_stay_whole() {
        // Too short to be worth dividing.
        assert_eq!(idle(40, 30).gpu_share(ms(0)), None);
        // The GPU 50× faster: dividing gains under 15 %.
        assert_eq!(idle(5000, 100).gpu_share(ms(0)), None);
        // The GPU's fixed cost above the CPU's whole time.
        assert_eq!(idle(300, 400).gpu_share(ms(350)), None);
        // No usable GPU.
        let cpu_only = Choice { gpu: None, gpu_finish: None, ..idle(400, 400) };
        assert_eq!(cpu_only.gpu_share(ms(0)), None);
    }

    #[test]
    fn measured_times_correct_later_estimates() {
        let s = Scheduler::default();
        for _ in 0..30 {
            let ticket = s.admit(Unit::Cpu, Work::Knn, ms(1), ms(1));
            std::thread::sleep(ms(4));
            ticket.finish();
        }
        // Runs took ~4× (or more, on a busy machine) what the model said.
        let c = s.correction(Unit::Cpu, Work::Knn);
        assert!(c > 3.0, "correction {c}");
        assert_eq!(s.correction(Unit::Cpu, Work::Join), 1.0);
        // So a 20 ms CPU estimate (too large to stay on the cores for being small) now loses to
        // a 50 ms GPU one.
        assert_eq!(s.choose(Work::Knn, ms(20), Some(ms(50))).unit, Unit::Gpu);
    }

    #[test]
    fn small_cpu_runs_run_together_but_never_beside_a_larger_one() {
        let s = std::sync::Arc::new(Scheduler::default());
        let started = Instant::now();
        let small: Vec<_> = (0..3).map(|_| s.admit(Unit::Cpu, Work::Knn, ms(1), ms(1))).collect();
        assert!(started.elapsed() < MAX_WAIT / 2, "small runs waited for each other");
        // With room on the cores a small run stays there, though the GPU is estimated faster.
        assert_eq!(s.choose(Work::Knn, ms(5), Some(ms(1))).unit, Unit::Cpu);
        small.into_iter().for_each(|t| {
            t.finish();
        });
        let large = s.admit(Unit::Cpu, Work::Join, ms(50), ms(50));
        let ran = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let handle = {
            let (s, ran) = (s.clone(), ran.clone());
            std::thread::spawn(move || {
                let ticket = s.admit(Unit::Cpu, Work::Knn, ms(1), ms(1));
                ran.store(true, std::sync::atomic::Ordering::SeqCst);
                ticket.finish();
            })
        };
        std::thread::sleep(ms(50));
        assert!(!ran.load(std::sync::atomic::Ordering::SeqCst), "a small run started beside a larger one");
        large.finish();
        handle.join().unwrap();
        assert!(ran.load(std::sync::atomic::Ordering::SeqCst));
    }

    #[test]
    fn waiting_runs_start_shortest_first() {
        let s = std::sync::Arc::new(Scheduler::default());
        let held = s.admit(Unit::Cpu, Work::Join, ms(500), ms(500));
        let order = std::sync::Arc::new(Mutex::new(Vec::new()));
        let handles: Vec<_> = [90u64, 30, 60]
            .into_iter()
            .map(|predicted| {
                let (s, order) = (s.clone(), order.clone());
                let handle = std::thread::spawn(move || {
                    let ticket = s.admit(Unit::Cpu, Work::Knn, ms(predicted), ms(predicted));
                    order.lock().unwrap().push(predicted);
                    ticket.finish();
                });
                std::thread::sleep(ms(20));
                handle
            })
            .collect();
        drop(held);
        handles.into_iter().for_each(|h| h.join().unwrap());
        assert_eq!(*order.lock().unwrap(), vec![30, 60, 90]);
    }

    #[test]
    fn a_run_handing_out_results_lets_the_next_one_start() {
        let s = Scheduler::default();
        let first = s.admit(Unit::Gpu, Work::Knn, ms(100), ms(100));
        // Its first results go to a consumer that may never read them: the unit is handed on.
        first.detach();
        first.detach();
        let second = s.admit(Unit::Gpu, Work::Knn, ms(1), ms(1));
        assert!(second.waited < ms(500), "{:?}", second.waited);
        second.finish();
        first.finish();
        let state = s.state.lock().unwrap();
        assert_eq!(state.running, [0, 0]);
        assert!(state.queued.iter().all(|&q| q.abs() < 1e-9), "{:?}", state.queued);
    }

    #[test]
    fn a_run_held_up_by_a_busy_unit_runs_anyway_in_the_end() {
        let s = Scheduler::default();
        let _held = s.admit(Unit::Gpu, Work::Join, ms(0), ms(0));
        let started = Instant::now();
        let ticket = s.admit(Unit::Gpu, Work::Knn, ms(1), ms(1));
        assert!(ticket.waited >= MAX_WAIT && started.elapsed() < MAX_WAIT + ms(500), "{:?}", ticket.waited);
    }
}
