//! The `simjoin.*` session options (`SET simjoin.metric = 'cosine'`) and the per-call options string
//! (`sim_join(t, 0.1, 'metric=cosine, column=embedding')`), which overrides them.

use datafusion::common::config::{ConfigEntry, ConfigExtension, ConfigField, ExtensionOptions, Visit};
use datafusion::common::{Result, config_err, plan_err};

use crate::op::{Device, Devices, IndexChoice, Metric, PairOrder};

/// Session-wide defaults of every simjoin function, settable with `SET simjoin.<name> = <value>`.
#[derive(Debug, Clone, PartialEq)]
pub struct SimJoinOptions {
    /// Distance function: l2, l2sq, cosine, inner_product, l1, linf.
    pub metric: Metric,
    /// Where to run: auto (per query, the GPU or the CPU, whichever is estimated to finish first), gpu, cpu.
    pub device: Device,
    /// Self-joins: also pair each row with itself.
    pub include_self: bool,
    /// Self-joins: `ordered` reports (a,b) and (b,a); `unordered` each pair once.
    pub pairs: PairOrder,
    /// The vector column, or numeric columns separated by spaces (`x y z`); empty means: the only
    /// list column, else every floating-point column.
    pub column: String,
    /// Columns (separated by spaces) both inputs hold, whose values a pair must share (`keys=zip`:
    /// pairs within each zip code; kNN: the nearest base rows with the query's keys); empty: none.
    pub keys: String,
    /// auto (cost model), grid, directory, brute_force (joins and range queries), or
    /// list_of_clusters (every function, metrics only).
    pub index: IndexChoice,
    /// Joins and range queries with the grid: dimensions to index, 1..=8 (0: the cost model decides).
    pub grid_dims: usize,
    /// GPU: bytes of device memory a run may use (0: all that is free); larger inputs are tiled.
    pub gpu_memory_limit: usize,
    /// GPU: `all` the devices, or ordinals such as `0,1`.
    pub devices: Devices,
    /// Bytes of converted vectors kept across queries for inputs held in memory (an in-memory
    /// table's), their rows resident on the GPU too; 0 keeps none.
    pub cache_size: usize,
    /// Plan `JOIN … ON dist(a.v, b.v) <= eps` as `sim_join` (functions/rewrite.rs).
    pub rewrite_joins: bool,
    /// Plan `WHERE dist(v, c) <= r` and `ORDER BY dist(v, c) LIMIT k` over one table as
    /// `range_query` and `knn` (functions/rewrite.rs); off by default: for one constant query the
    /// operator's fixed costs exceed DataFusion's own scan (docs/optimisations.md, v101).
    pub rewrite_scans: bool,
    /// On a cluster: the shares each call's work is divided into (0: the session's
    /// `datafusion.execution.target_partitions`).
    pub tasks: usize,
    /// kNN: answer approximately from the Multicurves index, to the recall `approx_recall` asks
    /// for unless `approx_effort` fixes the search.
    pub approx: bool,
    /// Approximate kNN: higher is slower and more accurate (candidates per curve: 160 × effort;
    /// through the cores' graph, 16 × effort seeds per curve and a pool of 32 × effort rows);
    /// `None` (`auto`, the default) to choose it for `approx_recall`.
    pub approx_effort: Option<f64>,
    /// Approximate kNN without `approx_effort`: the recall@k to reach, estimated on a sample
    /// (backend/approx_recall.rs).
    pub approx_recall: f64,
    /// Set, not by `SET`, for a session whose plans run on a DataFusion Ballista cluster (its
    /// configuration carries Ballista's): each executor then chooses the device of its part, and
    /// the client and the scheduler open no GPU.
    pub cluster: bool,
    /// Set, not by `SET`, by the self-test and the benchmarks ([`SimJoinOptions::set_checks`]).
    pub checks: crate::op::Checks,
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
    *SIZE.get_or_init(|| physical_memory().map_or(DEFAULT_CACHE_SIZE, |bytes| (bytes / 8).max(DEFAULT_CACHE_SIZE)))
}

/// The machine's memory in bytes (Linux: `MemTotal` of /proc/meminfo), if known.
fn physical_memory() -> Option<usize> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

impl Default for SimJoinOptions {
    fn default() -> Self {
        Self {
            metric: Metric::default(),
            device: Device::default(),
            include_self: false,
            pairs: PairOrder::default(),
            column: String::new(),
            keys: String::new(),
            index: IndexChoice::default(),
            grid_dims: 0,
            gpu_memory_limit: 0,
            devices: Devices::All,
            cache_size: default_cache_size(),
            rewrite_joins: true,
            rewrite_scans: false,
            tasks: 0,
            approx: false,
            approx_effort: None,
            approx_recall: crate::op::DEFAULT_APPROX_RECALL,
            cluster: false,
            checks: crate::op::Checks::default(),
        }
    }
}

const KEYS: [(&str, &str); 17] = [
    ("metric", "Distance function: l2, l2sq, cosine, inner_product, l1, linf; levenshtein for text columns"),
    ("device", "Where to run: auto (per query, the GPU or the CPU, whichever is estimated to finish first), gpu, cpu"),
    ("include_self", "Self-joins: also pair each row with itself (true/false)"),
    ("pairs", "Self-joins: ordered reports (a,b) and (b,a); unordered reports each pair once"),
    (
        "column",
        "Vector column, or numeric columns separated by spaces (x y z); empty: the only list column, else every floating-point column",
    ),
    (
        "keys",
        "Columns of both inputs (separated by spaces) whose values a pair must share, such as zip (pairs within each zip code; kNN: the nearest base rows with the query's keys); empty: none",
    ),
    (
        "index",
        "auto (sampled cost model), grid, directory (Böhm et al.'s quantile directory) or brute_force for joins and range queries; list_of_clusters for every function under a metric (l2, l1, linf, cosine, levenshtein)",
    ),
    ("grid_dims", "With the grid: dimensions to index, 1..=8 (0: the cost model decides)"),
    (
        "gpu_memory_limit",
        "GPU: device memory a run may use, such as 512M or 4G (0: all that is free); larger inputs are tiled",
    ),
    ("devices", "GPU: all (every visible GPU), or ordinals such as 0,1"),
    (
        "cache_size",
        "Converted vectors kept across queries for in-memory tables (rows resident on the GPU too), such as 4G (0: none; default: an eighth of the machine's memory, at least 4G)",
    ),
    (
        "rewrite_joins",
        "Plan joins on a distance bound (JOIN … ON l2_distance(a.v, b.v) <= eps) as sim_join (true/false)",
    ),
    (
        "rewrite_scans",
        "Plan WHERE dist(v, constant) <= r and ORDER BY dist(v, constant) LIMIT k over one table as range_query and knn (true/false; default false)",
    ),
    (
        "tasks",
        "On a cluster: the shares each call's work is divided into, each a task (0: datafusion.execution.target_partitions)",
    ),
    (
        "approx",
        "knn only: answer approximately from the Multicurves index, to approx_recall (true/false; default false: exact)",
    ),
    (
        "approx_recall",
        "Approximate knn: the recall@k to reach, from 0.5 to 1; the effort is chosen on a sample of the queries (default 0.95)",
    ),
    (
        "approx_effort",
        "Approximate knn: a fixed effort instead of approx_recall's choice, from 0.01 to 1000; higher is slower and more accurate (candidates per curve: 160 × effort; on the cores, graph seeds 16 × effort and pool 32 × effort; default auto)",
    ),
];

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

    /// Sets one option by name, with the messages the SQL `SET` and the options string share.
    /// `Err` holds a sentence without the caller's prefix.
    fn set_value(&mut self, key: &str, value: &str) -> std::result::Result<(), String> {
        match key {
            "metric" => self.metric = value.parse()?,
            "device" => self.device = value.parse()?,
            "include_self" => self.include_self = parse_bool("include_self", value)?,
            "rewrite_joins" => self.rewrite_joins = parse_bool("rewrite_joins", value)?,
            "devices" => self.devices = value.parse()?,
            "rewrite_scans" => self.rewrite_scans = parse_bool("rewrite_scans", value)?,
            "tasks" => {
                self.tasks = match value.trim().parse::<usize>() {
                    Ok(tasks) if tasks <= MAX_TASKS => tasks,
                    _ => {
                        return Err(format!(
                            "tasks must be a whole number from 0 (target_partitions) to {MAX_TASKS}, got '{value}'"
                        ));
                    }
                }
            }
            "approx" => self.approx = parse_bool("approx", value)?,
            "approx_effort" => {
                self.approx_effort = match value.trim().parse::<f64>() {
                    _ if value.trim().eq_ignore_ascii_case("auto") => None,
                    Ok(effort) if (0.01..=crate::op::MAX_APPROX_EFFORT).contains(&effort) => Some(effort),
                    _ => {
                        return Err(format!(
                            "approx_effort must be auto or a number from 0.01 to {}, got '{value}'",
                            crate::op::MAX_APPROX_EFFORT
                        ));
                    }
                }
            }
            "approx_recall" => {
                self.approx_recall = match value.trim().parse::<f64>() {
                    Ok(recall) if (0.5..=1.0).contains(&recall) => recall,
                    _ => return Err(format!("approx_recall must be a number from 0.5 to 1, got '{value}'")),
                }
            }
            "pairs" => self.pairs = value.parse()?,
            "column" => self.column = value.trim().to_string(),
            "keys" => self.keys = value.trim().to_string(),
            "gpu_memory_limit" => self.gpu_memory_limit = parse_memory_size("gpu_memory_limit", value, "no limit")?,
            "cache_size" => self.cache_size = parse_memory_size("cache_size", value, "none")?,
            "index" => self.index = value.parse()?,
            "grid_dims" => {
                self.grid_dims = match value.trim().parse::<usize>() {
                    Ok(k) if k <= 8 => k,
                    _ => return Err(format!("grid_dims must be an integer from 0 to 8, got '{value}'")),
                }
            }
            _ => {
                let known: Vec<&str> = KEYS.iter().map(|(k, _)| *k).collect();
                return Err(format!("unknown option '{key}' (expected one of {})", known.join(", ")));
            }
        }
        Ok(())
    }

    fn value_of(&self, key: &str) -> String {
        match key {
            "metric" => self.metric.to_string(),
            "device" => self.device.to_string(),
            "include_self" => self.include_self.to_string(),
            "pairs" => self.pairs.to_string(),
            "index" => self.index.to_string(),
            "grid_dims" => self.grid_dims.to_string(),
            "gpu_memory_limit" => self.gpu_memory_limit.to_string(),
            "cache_size" => self.cache_size.to_string(),
            "rewrite_joins" => self.rewrite_joins.to_string(),
            "devices" => self.devices.to_string(),
            "rewrite_scans" => self.rewrite_scans.to_string(),
            "tasks" => self.tasks.to_string(),
            "approx" => self.approx.to_string(),
            "approx_effort" => self.approx_effort.map_or("auto".to_string(), |effort| effort.to_string()),
            "approx_recall" => self.approx_recall.to_string(),
            "keys" => self.keys.clone(),
            _ => self.column.clone(),
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

    /// The key columns named by the options (`keys`), in order.
    pub fn keys(&self) -> Vec<String> {
        self.keys.split_whitespace().map(str::to_string).collect()
    }

    /// The vector column named by the options, if any.
    pub fn column(&self) -> Option<&str> {
        (!self.column.is_empty()).then_some(self.column.as_str())
    }
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
            .map(|(key, description)| ConfigEntry {
                key: format!("{}.{key}", Self::PREFIX),
                value: Some(self.value_of(key)),
                description,
            })
            .collect()
    }
}

impl ConfigField for SimJoinOptions {
    fn visit<V: Visit>(&self, v: &mut V, key_prefix: &str, _description: &'static str) {
        for (key, description) in KEYS {
            v.some(&format!("{key_prefix}.{key}"), self.value_of(key), description);
        }
    }

    fn set(&mut self, key: &str, value: &str) -> Result<()> {
        self.set_value(key, value).or_else(|message| config_err!("simjoin.{key}: {message}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
             (expected one of metric, device, include_self, pairs, column, keys, index, grid_dims, gpu_memory_limit, devices, cache_size, rewrite_joins, rewrite_scans, tasks, approx, approx_recall, approx_effort)"
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
