//! The `simjoin.*` session options (`SET simjoin.metric = 'cosine'`) and the per-call options string
//! (`sim_join(t, 0.1, 'metric=cosine, column=embedding')`), which overrides them.

use std::fmt;

use datafusion::common::config::{ConfigEntry, ConfigExtension, ConfigField, ExtensionOptions, Visit};
use datafusion::common::{Result, config_err, plan_err};

use crate::op::{Device, Devices, IndexChoice, Metric, Operation, PairOrder, SimilarityOp};

/// Declares the options once: the fields of [`SimJoinOptions`] (each documented by its
/// description), their defaults, their keys with the descriptions `SHOW simjoin.*` lists, how a value
/// is parsed (`parse(key, value)`, an error sentence without the caller's prefix) and how it is
/// printed ([`OptionValue::show`]). The fields after `hidden` are set from Rust, never by `SET`.
macro_rules! simjoin_options {
    (
        settable { $( $key:ident : $type:ty = $default:expr, $parse:expr, $description:literal; )* }
        hidden {
            $( $(#[doc = $hidden_doc:literal])* $hidden:ident : $hidden_type:ty = $hidden_default:expr; )*
        }
    ) => {
        /// Session-wide defaults of every simjoin function, settable with `SET simjoin.<name> = <value>`
        /// and overridden by a call's options string.
        #[derive(Debug, Clone, PartialEq)]
        pub struct SimJoinOptions {
            $( #[doc = $description] pub $key: $type, )*
            $( $(#[doc = $hidden_doc])* pub $hidden: $hidden_type, )*
        }

        impl Default for SimJoinOptions {
            fn default() -> Self {
                Self { $( $key: $default, )* $( $hidden: $hidden_default, )* }
            }
        }

        /// Every option's key and description, in the order `SHOW` lists them.
        const KEYS: &[(&str, &str)] = &[ $( (stringify!($key), $description), )* ];

        impl SimJoinOptions {
            /// Sets one option by name, with the messages the SQL `SET` and the options string share.
            /// `Err` holds a sentence without the caller's prefix.
            fn set_value(&mut self, key: &str, value: &str) -> std::result::Result<(), String> {
                match key {
                    $( stringify!($key) => self.$key = ($parse)(stringify!($key), value)?, )*
                    _ => {
                        let known: Vec<&str> = KEYS.iter().map(|(k, _)| *k).collect();
                        return Err(format!("unknown option '{key}' (expected one of {})", known.join(", ")));
                    }
                }
                Ok(())
            }

            /// Option `key`'s value as `SHOW` prints it (and `set_value` reads it back).
            fn value_of(&self, key: &str) -> Option<String> {
                match key {
                    $( stringify!($key) => Some(OptionValue::show(&self.$key)), )*
                    _ => None,
                }
            }
        }
    };
}

simjoin_options! {
    settable {
    metric: Metric = Metric::default(), parse_from_str,
        "Distance function: l2, l2sq, cosine, inner_product, l1, linf; levenshtein for text columns";
    device: Device = Device::default(), parse_from_str,
        "Where to run: auto (per query, the GPU or the CPU, whichever is estimated to finish first), gpu, cpu";
    include_self: bool = false, parse_bool, "Self-joins: also pair each row with itself (true/false)";
    pairs: PairOrder = PairOrder::default(), parse_from_str,
        "Self-joins: ordered reports (a,b) and (b,a); unordered reports each pair once";
    column: String = String::new(), parse_text,
        "Vector column, or numeric columns separated by spaces (x y z); empty: the only list column, else every floating-point column";
    keys: String = String::new(), parse_text,
        "Columns of both inputs (separated by spaces) whose values a pair must share, such as zip (pairs within each zip code; kNN: the nearest base rows with the query's keys); empty: none";
    index: IndexChoice = IndexChoice::default(), parse_from_str,
        "auto (sampled cost model), grid, directory (Böhm et al.'s quantile directory) or brute_force for joins and range queries; list_of_clusters for every function under a metric (l2, l1, linf, cosine, levenshtein)";
    grid_dims: usize = 0, |key, value| parse_count(key, value, 0, 8),
        "With the grid: dimensions to index, 1..=8 (0: the cost model decides)";
    gpu_memory_limit: usize = 0, |key, value| parse_memory_size(key, value, "no limit"),
        "GPU: device memory a run may use, such as 512M or 4G (0: all that is free); larger inputs are tiled";
    devices: Devices = Devices::All, parse_from_str, "GPU: all (every visible GPU), or ordinals such as 0,1";
    cache_size: usize = default_cache_size(), |key, value| parse_memory_size(key, value, "none"),
        "Converted vectors kept across queries for in-memory tables (rows resident on the GPU too), such as 4G (0: none; default: an eighth of the machine's memory, at least 4G)";
    rewrite_joins: bool = true, parse_bool,
        "Plan joins on a distance bound (JOIN … ON l2_distance(a.v, b.v) <= eps) as sim_join (true/false)";
    rewrite_scans: ScanRewrite = ScanRewrite::Auto, parse_from_str,
        "Plan WHERE dist(v, constant) <= r and ORDER BY dist(v, constant) LIMIT k over one table as range_query and knn: auto (where the operator is estimated faster than DataFusion's scan of one query: nowhere measured so far), true, false";
    tasks: usize = 0, |key, value| parse_count(key, value, 0, MAX_TASKS),
        "On a cluster: the shares each call's work is divided into, each a task (0: datafusion.execution.target_partitions)";
    approx: bool = false, parse_bool,
        "knn only: answer approximately from the Multicurves index, to approx_recall (true/false; default false: exact)";
    approx_recall: f64 = crate::op::DEFAULT_APPROX_RECALL, |key, value| parse_number(key, value, 0.5, 1.0),
        "Approximate knn: the recall@k to reach, from 0.5 to 1; the effort is chosen on a sample of the queries (default 0.95)";
    approx_effort: Option<f64> = None, |key, value| parse_auto_or_number(key, value, 0.01, crate::op::MAX_APPROX_EFFORT),
        "Approximate knn: a fixed effort instead of approx_recall's choice, from 0.01 to 1000; higher is slower and more accurate (candidates per curve: 160 × effort; on the cores, graph seeds 16 × effort and pool 32 × effort; default auto)";
    index_store: String = String::from("auto"), parse_text,
        "Approximate knn: where a base's index (its curves, graph and calibrations) is kept across processes, keyed by the vectors themselves: auto (the cache folder: $SIMJOIN_CACHE_DIR, else $XDG_CACHE_HOME/simjoin, else ~/.cache/simjoin; its indexes/ folder, at most 16 GiB), off, or a folder (default auto)";
    }
    hidden {
        /// Set for a session whose plans run on a DataFusion Ballista cluster (its configuration
        /// carries Ballista's): each executor then chooses the device of its part, and the client
        /// and the scheduler open no GPU.
        cluster: bool = false;
        /// Set by the self-test and the benchmarks ([`SimJoinOptions::set_checks`]).
        checks: crate::op::Checks = crate::op::Checks::default();
    }
}

/// When a filter or `ORDER BY … LIMIT` on the distance to a constant over one table is planned as
/// `range_query` or `knn` (functions/rewrite.rs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ScanRewrite {
    /// Where the operator is estimated faster than DataFusion's own scan. For the one constant
    /// query these plans have, DataFusion's scalar function over each row costs less than the
    /// operator's conversion of the rows wherever measured: 0.34 s against 0.43 s over 300,000 ×
    /// 64 on 2 cores; over 10⁶ × 128 on an H200 host 0.245 s against 0.317 s from a file, and
    /// 0.020 s against 0.027 s in memory with the GPU open. So `auto` keeps DataFusion's plan;
    /// joins and ranked kNN joins (many queries) are the operator's under `rewrite_joins`.
    #[default]
    Auto,
    /// Always.
    Always,
    /// Never.
    Never,
}

impl fmt::Display for ScanRewrite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ScanRewrite::Auto => "auto",
            ScanRewrite::Always => "true",
            ScanRewrite::Never => "false",
        })
    }
}

impl std::str::FromStr for ScanRewrite {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(ScanRewrite::Auto),
            "true" | "1" | "yes" | "on" => Ok(ScanRewrite::Always),
            "false" | "0" | "no" | "off" => Ok(ScanRewrite::Never),
            _ => Err(format!("rewrite_scans must be auto, true or false, got '{s}'")),
        }
    }
}

/// How an option's value is printed by `SHOW` (and read back by its parser).
trait OptionValue {
    fn show(&self) -> String;
}

/// The options printed as they display.
macro_rules! displayed_option_values {
    ($($type:ty),*) => {
        $(impl OptionValue for $type {
            fn show(&self) -> String {
                self.to_string()
            }
        })*
    };
}

displayed_option_values!(Metric, Device, Devices, PairOrder, IndexChoice, ScanRewrite, bool, usize, f64, String);

/// `approx_effort`'s `None` is `auto`.
impl OptionValue for Option<f64> {
    fn show(&self) -> String {
        self.map_or_else(|| "auto".to_string(), |value| value.to_string())
    }
}

/// The most shares a call's work may be divided into on a cluster (each is a task).
pub const MAX_TASKS: usize = 4096;

/// `cache_size`'s least default: room for a 1M × 128 base (1 GiB as f64) a few times over.
pub const DEFAULT_CACHE_SIZE: usize = 4 << 30;

/// `cache_size`'s default on this machine: an eighth of its memory, at least
/// [`DEFAULT_CACHE_SIZE`]. A base larger than the cache is converted and copied to each GPU again
/// by every query (a 10M × 128 base's 10 GB of f64 rows took 1.28× instead of 1.89× on two H100s
/// under a 4G cache, BENCHMARKS.md "Several GPUs"); an eighth leaves the rest of the memory to
/// the tables themselves and the runs.
pub fn default_cache_size() -> usize {
    static SIZE: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *SIZE.get_or_init(|| available_memory().map_or(DEFAULT_CACHE_SIZE, |bytes| (bytes / 8).max(DEFAULT_CACHE_SIZE)))
}

/// The folder simjoin keeps its disk caches in (compiled kernels, stored indexes), if the
/// environment names one: `$SIMJOIN_CACHE_DIR`, else `$XDG_CACHE_HOME/simjoin`, else
/// `~/.cache/simjoin`.
pub fn cache_dir() -> Option<std::path::PathBuf> {
    let from_env = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty()).map(std::path::PathBuf::from);
    from_env("SIMJOIN_CACHE_DIR")
        .or_else(|| from_env("XDG_CACHE_HOME").map(|d| d.join("simjoin")))
        .or_else(|| from_env("HOME").map(|d| d.join(".cache").join("simjoin")))
}

/// The memory this process may use, in bytes, if known: the machine's (Linux: `MemTotal` of
/// /proc/meminfo), or its container's limit (cgroup v2 `memory.max`, v1 `memory.limit_in_bytes`)
/// where lower.
pub fn available_memory() -> Option<usize> {
    let total = std::fs::read_to_string("/proc/meminfo").ok().and_then(|meminfo| {
        let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
        let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
        kib.checked_mul(1024)
    });
    let container = ["/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"]
        .iter()
        .filter_map(|path| std::fs::read_to_string(path).ok()?.trim().parse::<usize>().ok())
        .min();
    match (total, container) {
        (Some(total), Some(container)) => Some(total.min(container)),
        (total, container) => total.or(container),
    }
}

impl SimJoinOptions {
    /// The session's options (the defaults where none were registered).
    pub fn of(config: &datafusion::common::config::ConfigOptions) -> Self {
        // A plan for a cluster is one whose session carries Ballista's configuration.
        #[cfg(feature = "cluster")]
        let cluster = config.extensions.get::<ballista_core::config::BallistaConfig>().is_some();
        #[cfg(not(feature = "cluster"))]
        let cluster = false;
        Self { cluster, ..config.extensions.get::<SimJoinOptions>().cloned().unwrap_or_default() }
    }

    /// Sets the self-test's and benchmarks' switches on `ctx`'s session (its later queries); for
    /// the `simjoin` binary, not part of the library's API.
    #[doc(hidden)]
    pub fn set_checks(ctx: &datafusion::prelude::SessionContext, checks: crate::op::Checks) {
        let state = ctx.state_ref();
        let mut state = state.write();
        let extensions = &mut state.config_mut().options_mut().extensions;
        match extensions.get_mut::<SimJoinOptions>() {
            Some(options) => options.checks = checks,
            None => extensions.insert(SimJoinOptions { checks, ..Default::default() }),
        }
    }

    /// These options overridden by a call's options string such as `'metric=cosine, column=v'`.
    pub fn with_call_options(&self, function: &str, text: &str) -> Result<Self> {
        let mut options = self.clone();
        // (key, value) pairs; a bare item after `devices=` continues its list (`devices=0,1`).
        let mut items: Vec<(String, String)> = Vec::new();
        for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            match (item.split_once('='), items.last_mut()) {
                (Some((key, value)), _) => items.push((key.trim().to_ascii_lowercase(), value.trim().to_string())),
                (None, Some((key, value))) if key == "devices" => *value = format!("{value},{item}"),
                (None, _) => {
                    return plan_err!("{function}: options string '{text}': expected key=value, got '{item}'");
                }
            }
        }
        for (key, value) in &items {
            let value = value.trim_matches(|c| c == '\'' || c == '"');
            // Session-wide `SET simjoin.approx` applies to knn alone; in a call to another
            // function the option is a mistake that must not pass for an exact answer's setting.
            if function != "knn"
                && key.starts_with("approx")
                && (key != "approx" || parse_bool(&key, value) != Ok(false))
            {
                return plan_err!(
                    "{function}: option {key}={value} is for knn only: {function} always answers exactly"
                );
            }
            if let Err(message) = options.set_value(&key, value) {
                return plan_err!("{function}: options string '{text}': {message}");
            }
        }
        // A call's recall target overrides a session's fixed effort; a call cannot ask for both,
        // and its tuning of the approximate search without `approx=true` would go unused.
        let set = |name: &str| items.iter().any(|(key, _)| key == name);
        if set("approx_recall") && set("approx_effort") && options.approx_effort.is_some() {
            return plan_err!(
                "{function}: options string '{text}': approx_recall chooses the effort that approx_effort fixes; give one of them"
            );
        }
        if set("approx_recall") {
            options.approx_effort = None;
        }
        if function == "knn" && !options.approx && (set("approx_recall") || set("approx_effort")) {
            return plan_err!(
                "{function}: options string '{text}': approx_recall and approx_effort tune the approximate search; add approx=true to ask for it (without it the answer is exact)"
            );
        }
        Ok(options)
    }

    /// `operation` with these options, which say how and where it runs, checked once
    /// ([`SimilarityOp::validate`]): the option combinations no machine can run are a planning error
    /// naming the function, the option and the value. `approx` reaches kNN alone (a call to another
    /// function that asks for it fails in [`SimJoinOptions::with_call_options`]).
    pub fn similarity_op(&self, operation: Operation) -> Result<SimilarityOp> {
        let approx = (self.approx && matches!(operation, Operation::Knn { .. })).then_some(crate::op::Approx {
            effort: self.approx_effort.unwrap_or(crate::op::DEFAULT_APPROX_EFFORT),
            recall: self.approx_effort.is_none().then_some(self.approx_recall),
            planned_queries: None,
            curves_alone: self.checks.curves_alone,
        });
        let op = SimilarityOp {
            operation,
            metric: self.metric,
            device: self.device,
            index: self.index,
            grid_dims: self.grid_dims,
            gpu_memory_limit: self.gpu_memory_limit,
            devices: self.devices.clone(),
            cache_size: self.cache_size,
            tasks: self.tasks,
            scalar_semantics: false,
            approx,
            ties: crate::op::KnnTies::None,
            keys: self.keys(),
            index_store: self.index_store.clone(),
            checks: self.checks,
        };
        op.validate()?;
        Ok(op)
    }

    /// The key columns named by the options (`keys`), in order.
    pub fn keys(&self) -> Vec<String> {
        self.keys.split_whitespace().map(str::to_string).collect()
    }

    /// The vector column named by the options, if any.
    pub fn column(&self) -> Option<&str> {
        (!self.column.is_empty()).then_some(self.column.as_str())
    }
}

/// An option whose type spells its values (`Metric`, `Device`, …).
fn parse_from_str<T: std::str::FromStr<Err = String>>(_key: &str, value: &str) -> std::result::Result<T, String> {
    value.parse()
}

/// A column list, as written.
fn parse_text(_key: &str, value: &str) -> std::result::Result<String, String> {
    Ok(value.trim().to_string())
}

/// A whole number from `low` to `high`.
fn parse_count(key: &str, value: &str, low: usize, high: usize) -> std::result::Result<usize, String> {
    match value.trim().parse::<usize>() {
        Ok(n) if (low..=high).contains(&n) => Ok(n),
        _ => Err(format!("{key} must be a whole number from {low} to {high}, got '{value}'")),
    }
}

/// A number from `low` to `high`.
fn parse_number(key: &str, value: &str, low: f64, high: f64) -> std::result::Result<f64, String> {
    match value.trim().parse::<f64>() {
        Ok(x) if (low..=high).contains(&x) => Ok(x),
        _ => Err(format!("{key} must be a number from {low} to {high}, got '{value}'")),
    }
}

/// `auto` (`None`) or a number from `low` to `high`.
fn parse_auto_or_number(key: &str, value: &str, low: f64, high: f64) -> std::result::Result<Option<f64>, String> {
    if value.trim().eq_ignore_ascii_case("auto") {
        return Ok(None);
    }
    parse_number(key, value, low, high)
        .map(Some)
        .map_err(|_| format!("{key} must be auto or a number from {low} to {high}, got '{value}'"))
}

/// Option `key`'s boolean value.
fn parse_bool(key: &str, value: &str) -> std::result::Result<bool, String> {
    match value.trim().to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Ok(true),
        "false" | "0" | "no" | "off" => Ok(false),
        _ => Err(format!("{key} must be true or false, got '{value}'")),
    }
}

/// Option `key`'s size in bytes as DataFusion's `datafusion.runtime.memory_limit` takes it (`512K`,
/// `64M`, `1.5G`: binary units), or a plain number of bytes; the error says what 0 means (`zero`).
fn parse_memory_size(key: &str, value: &str, zero: &str) -> std::result::Result<usize, String> {
    let value = value.trim();
    value.parse::<usize>().or_else(|_| {
        datafusion::execution::context::SessionContext::parse_capacity_limit(key, value).map_err(|_| {
            format!("{key} must be a size such as 512M or 4G (units K, M, G), or 0 for {zero}, got '{value}'")
        })
    })
}

impl ConfigExtension for SimJoinOptions {
    const PREFIX: &'static str = "simjoin";
}

impl ExtensionOptions for SimJoinOptions {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }

    fn cloned(&self) -> Box<dyn ExtensionOptions> {
        Box::new(self.clone())
    }

    fn set(&mut self, key: &str, value: &str) -> Result<()> {
        ConfigField::set(self, key, value)
    }

    fn entries(&self) -> Vec<ConfigEntry> {
        KEYS.iter()
            .map(|&(key, description)| ConfigEntry {
                key: format!("{}.{key}", Self::PREFIX),
                value: self.value_of(key),
                description,
            })
            .collect()
    }
}

impl ConfigField for SimJoinOptions {
    fn visit<V: Visit>(&self, v: &mut V, key_prefix: &str, _description: &'static str) {
        for &(key, description) in KEYS {
            v.some(&format!("{key_prefix}.{key}"), self.value_of(key).unwrap_or_default(), description);
        }
    }

    fn set(&mut self, key: &str, value: &str) -> Result<()> {
        self.set_value(key, value).or_else(|message| config_err!("simjoin.{key}: {message}"))
    }
}

#[cfg(test)]
mod tests {
    use super::SimJoinOptions;
    use crate::Devices;
    use crate::op::{Device, Metric};

    #[test]
    fn tasks_are_bounded() {
        assert_eq!(SimJoinOptions::default().with_call_options("knn", "tasks=8").unwrap().tasks, 8);
        let message = SimJoinOptions::default().with_call_options("knn", "tasks=100000").unwrap_err().to_string();
        assert!(message.contains("knn: options string 'tasks=100000': tasks must be a whole number"), "{message}");
    }

    #[test]
    fn call_options_override_defaults() {
        let o =
            SimJoinOptions::default().with_call_options("knn", "metric=cosine, column = 'emb', device=cpu").unwrap();
        assert_eq!(o.metric, Metric::Cosine);
        assert_eq!(o.column(), Some("emb"));
        assert_eq!(o.device, Device::Cpu);
    }

    #[test]
    fn bad_call_options_name_the_function_and_value() {
        let err = SimJoinOptions::default().with_call_options("knn", "metrc=l1").unwrap_err();
        assert_eq!(
            err.strip_backtrace(),
            "Error during planning: knn: options string 'metrc=l1': unknown option 'metrc' \
             (expected one of metric, device, include_self, pairs, column, keys, index, grid_dims, gpu_memory_limit, devices, cache_size, rewrite_joins, rewrite_scans, tasks, approx, approx_recall, approx_effort, index_store)"
        );
        let err = SimJoinOptions::default().with_call_options("knn", "cosine").unwrap_err();
        assert!(err.to_string().contains("expected key=value, got 'cosine'"), "{err}");
    }

    #[test]
    fn device_lists_take_commas_inside_the_options_string() {
        let o = SimJoinOptions::default().with_call_options("knn", "devices=0,1, metric=l1").unwrap();
        assert_eq!(o.devices, Devices::List(vec![0, 1]));
        assert_eq!(o.metric, Metric::L1);
        assert_eq!(SimJoinOptions::default().with_call_options("knn", "devices=all").unwrap().devices, Devices::All);
        let twice = SimJoinOptions::default().with_call_options("knn", "devices=1,1").unwrap_err();
        assert!(twice.to_string().contains("devices '1,1' names GPU 1 twice"), "{twice}");
    }

    #[test]
    fn gpu_memory_limits_take_units_or_bytes() {
        let o = SimJoinOptions::default().with_call_options("sim_join", "gpu_memory_limit=64M").unwrap();
        assert_eq!(o.gpu_memory_limit, 64 << 20);
        let o = SimJoinOptions::default().with_call_options("sim_join", "gpu_memory_limit=1.5G").unwrap();
        assert_eq!(o.gpu_memory_limit, 3 << 29);
        assert_eq!(
            SimJoinOptions::default().with_call_options("knn", "gpu_memory_limit=4096").unwrap().gpu_memory_limit,
            4096
        );
        let err = SimJoinOptions::default().with_call_options("knn", "gpu_memory_limit=lots").unwrap_err();
        assert!(
            err.to_string().contains("knn: options string 'gpu_memory_limit=lots': gpu_memory_limit must be a size"),
            "{err}"
        );
        let err = SimJoinOptions::default().with_call_options("knn", "gpu_memory_limit=-1G").unwrap_err();
        assert!(err.to_string().contains("got '-1G'"), "{err}");
    }
}
