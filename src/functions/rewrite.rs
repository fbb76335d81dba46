//! Plain SQL planned as the similarity operators: an optimizer rule (registered by
//! `simjoin::register`, switched off with `SET simjoin.rewrite_joins = false`) that plans
//!
//! ```sql
//! SELECT … FROM a JOIN b ON l2_distance(a.v, b.v) <= 0.5 [AND …]    -- sim_join(a, b, 0.5)
//! SELECT … FROM a JOIN b ON a.zip = b.zip AND levenshtein(a.n, b.n) <= 2
//!                                      -- sim_join(a, b, 2, 'metric=levenshtein, keys=…'), per zip
//! SELECT … FROM t WHERE l2_distance(v, [0.1, 0.2]) <= 0.5 [AND …]   -- range_query(t, [0.1, 0.2], 0.5)
//! SELECT … FROM t ORDER BY l2_distance(v, [0.1, 0.2]) [, id] LIMIT 10 -- knn(t, [0.1, 0.2], 10) candidates
//! SELECT … FROM q, b QUALIFY ROW_NUMBER() OVER (PARTITION BY q.id
//!     ORDER BY l2_distance(q.v, b.v)) <= 10                           -- knn(q, b, 10) candidates
//! ```
//!
//! — the distance functions of `distance.rs`, DataFusion's `array_distance` (`list_distance`) and
//! `levenshtein`, either argument order, `<=` or `<`, the constant on either side; a dot product
//! (`inner_product`, `array_inner_product`) bounded from below, or sorted descending, as
//! `metric=inner_product` — with the other conjuncts as a filter above the operator. The inputs are
//! the plans below the join, filter or sort, read through views.
//!
//! Why the answer cannot change: the operator keeps a pair iff its distance, by the same f64
//! formula (or the same edit distance), is `<=` the threshold; `d < t` is `d <= t⁻` for the
//! largest float `t⁻` below `t` (and `d <= ⌈t⌉ − 1` for whole-number edit distances). The rows its
//! contract skips are NULL vectors and vectors holding a NULL — whose scalar distance is NULL,
//! which no condition keeps — and, not NULL, vectors holding NaN or ±∞ and zero vectors under
//! cosine. Their scalar distances can be NaN, and SQL's `<=` orders floats totally, so a NaN with
//! its sign bit set (what `0/0` and `∞ − ∞` give on x86) passes any bound; L∞'s maximum ignores a
//! NaN coordinate. So the rewritten operator runs with `SimilarityOp::scalar_semantics`: those
//! rows too are compared, by the scalar formula, and kept as SQL keeps them — within their key's
//! group where the join has equality keys (exec/keyed.rs). Left as planned: outer joins,
//! disjunctions, a distance bounded from below, a narrowing cast of an argument, a threshold of
//! -0.0, keys compared with `IS NOT DISTINCT FROM`, and any join whose inputs the operator would
//! reject (no list column, a text column under a vector metric): a rewrite never turns a valid
//! query into an error.

use std::sync::Arc;

use datafusion::arrow::datatypes::DataType;
use datafusion::catalog::TableProvider;
use datafusion::catalog::view::ViewTable;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{Column, DFSchemaRef, NullEquality, Result, ScalarValue};
use datafusion::datasource::provider_as_source;
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::utils::{conjunction, split_conjunction};
use datafusion::logical_expr::{
    BinaryExpr, Expr, Filter, Join, JoinType, LogicalPlan, LogicalPlanBuilder, Operator, Projection, Sort,
};
use datafusion::optimizer::optimizer::ApplyOrder;
use datafusion::optimizer::{OptimizerConfig, OptimizerRule};

use super::distance::Formula;
use crate::op::{KnnTies, Metric, Operation, PairOrder, SimilarityOp, validate_threshold};
use crate::options::{ScanRewrite, SimJoinOptions};
use crate::table::TableInput;
use crate::vectors::VectorSource;

/// The qualifier of a rewritten join's or range query's scan.
const SCAN: &str = "simjoin_join";
/// The qualifier of a rewritten ORDER BY … LIMIT's candidate scan.
const NEAREST: &str = "simjoin_nearest";

/// The rule; see the module docs (and `knn_join.rs` for kNN joins).
#[derive(Debug, Default)]
pub struct SimilarityJoinRewrite;

impl OptimizerRule for SimilarityJoinRewrite {
    fn name(&self) -> &str {
        "simjoin_rewrite_joins"
    }

    fn apply_order(&self) -> Option<ApplyOrder> {
        Some(ApplyOrder::BottomUp)
    }

    fn supports_rewrite(&self) -> bool {
        true
    }

    fn rewrite(&self, plan: LogicalPlan, config: &dyn OptimizerConfig) -> Result<Transformed<LogicalPlan>> {
        // The rule visits every node of every optimizer pass: the options are read only for the
        // three kinds it rewrites.
        if !matches!(plan, LogicalPlan::Join(_) | LogicalPlan::Filter(_) | LogicalPlan::Sort(_)) {
            return Ok(Transformed::no(plan));
        }
        let options = SimJoinOptions::of(&config.options());
        let rewritten = match &plan {
            LogicalPlan::Join(join) if options.rewrite_joins => rewrite_join(join, &options),
            LogicalPlan::Filter(filter) => options
                .rewrite_joins
                .then(|| super::knn_join::rewrite_knn_join(filter, &options))
                .flatten()
                .or_else(|| rewrites_scans(&options).then(|| rewrite_range(filter, &options)).flatten()),
            LogicalPlan::Sort(sort) if rewrites_scans(&options) => rewrite_nearest(sort, &options),
            _ => None,
        };
        Ok(match rewritten {
            Some(rewritten) => Transformed::yes(rewritten),
            None => Transformed::no(plan),
        })
    }
}

/// Whether one-table filters and sorts on a distance are planned as the operator: as the option
/// says, or under `auto` where the operator is estimated faster ([`ScanRewrite::Auto`]).
fn rewrites_scans(options: &SimJoinOptions) -> bool {
    match options.rewrite_scans {
        ScanRewrite::Always => true,
        ScanRewrite::Never | ScanRewrite::Auto => false,
    }
}

/// A conjunct `dist(x, y) <= t` whose arguments are columns of the two sides.
struct DistanceBound {
    metric: Metric,
    /// The column read on the join's left input, and on its right.
    left: Column,
    right: Column,
    threshold: f64,
}

/// The join as a scan of `sim_join` under a projection back to the join's columns, or `None`
/// when the join is not of the shape or the operator would not take its inputs.
fn rewrite_join(join: &Join, options: &SimJoinOptions) -> Option<LogicalPlan> {
    if join.join_type != JoinType::Inner || join.null_equality != NullEquality::NullEqualsNothing {
        return None;
    }
    // Equality keys (`ON a.zip = b.zip AND …`) make it a join within equal keys; not on a
    // cluster, where the operator does not take them.
    if !join.on.is_empty() && options.cluster {
        return None;
    }
    let (bound, rest) = take_conjunct(join.filter.as_ref()?, |c| distance_bound(c, join))?;

    let (keys, [left_plan, right_plan]) = keyed_inputs(join)?;
    let options = SimJoinOptions { metric: bound.metric, keys: keys.join(" "), ..options.clone() };
    let left = view_input(&left_plan, &bound.left, bound.metric, "left")?;
    let right = view_input(&right_plan, &bound.right, bound.metric, "right")?;
    let eps = checked_threshold(bound.threshold, bound.metric)?;
    let operation = Operation::SimJoin { eps, self_join: false, include_self: false, pairs: PairOrder::Ordered };
    let op = SimilarityOp { scalar_semantics: true, ..options.similarity_op(operation).ok()? };
    let table = super::table(op, left, Some(right), ["left", "right"], options.cluster).ok()?;

    // The join's columns in order: the left input's, then the right's.
    let left_len = join.left.schema().fields().len();
    let prefix = |i: usize| if i < left_len { "left_" } else { "right_" };
    let mut builder = scan_as(table, SCAN, &join.schema, prefix)?;
    if let Some(filter) = conjunction(rest) {
        builder = builder.filter(filter).ok()?;
    }
    builder.build().ok()
}

/// The join's equality keys as columns of its inputs: each input under a projection that adds its
/// side's key expressions as `simjoin_key_0`, `simjoin_key_1`, … (DataFusion has cast both sides
/// of each `=` to one type). No keys: the inputs as they are.
pub(super) fn keyed_inputs(join: &Join) -> Option<(Vec<String>, [LogicalPlan; 2])> {
    let keys: Vec<String> = (0..join.on.len()).map(|i| format!("simjoin_key_{i}")).collect();
    let with_keys = |input: &Arc<LogicalPlan>, side: fn(&(Expr, Expr)) -> &Expr| -> Option<LogicalPlan> {
        if keys.is_empty() {
            return Some(input.as_ref().clone());
        }
        let columns = input.schema().columns().into_iter().map(Expr::Column);
        let computed = join.on.iter().zip(&keys).map(|(pair, key)| side(pair).clone().alias(key));
        LogicalPlanBuilder::from(input.clone()).project(columns.chain(computed)).ok()?.build().ok()
    };
    let left = with_keys(&join.left, |(l, _)| l)?;
    let right = with_keys(&join.right, |(_, r)| r)?;
    Some((keys, [left, right]))
}

/// `conjunct` as a distance bound between the join's two sides.
fn distance_bound(conjunct: &Expr, join: &Join) -> Option<DistanceBound> {
    let (call, metric, threshold) = bounded_call(conjunct)?;
    let [x, y] = call.args.as_slice() else { return None };
    let (x, y) = (operand(x)?, operand(y)?);
    let (left, right) = match (side(join, &x)?, side(join, &y)?) {
        (Side::Left, Side::Right) => (x, y),
        (Side::Right, Side::Left) => (y, x),
        _ => return None,
    };
    Some(DistanceBound { metric, left, right, threshold })
}

/// `conjunct` as `f(x, y) <= t` for a distance function `f` (or `< t`, or the constant first, or
/// a dot product bounded from below): the call, its metric, and the bound as the operator takes
/// it (`<=`). A dot product bounded from below is the negative inner product bounded from above:
/// negation reverses SQL's total order exactly.
fn bounded_call(conjunct: &Expr) -> Option<(&ScalarFunction, Metric, f64)> {
    let Expr::BinaryExpr(BinaryExpr { left, op, right }) = conjunct else { return None };
    let (call, op, constant) = match (left.as_ref(), right.as_ref()) {
        (Expr::ScalarFunction(call), Expr::Literal(value, _)) => (call, *op, value),
        (Expr::Literal(value, _), Expr::ScalarFunction(call)) => (call, op.swap()?, value),
        _ => return None,
    };
    let threshold = match constant.cast_to(&DataType::Float64).ok()? {
        ScalarValue::Float64(Some(t)) if t.is_finite() => t,
        _ => return None,
    };
    let (metric, threshold, strict) = match (formula(call.func.name())?, op) {
        (Formula::Dot, Operator::GtEq | Operator::Gt) => (Metric::InnerProduct, -threshold, op == Operator::Gt),
        (Formula::Metric(metric), Operator::LtEq | Operator::Lt) => (metric, threshold, op == Operator::Lt),
        _ => return None,
    };
    let threshold = match (strict, metric.counts()) {
        (false, false) => threshold,
        // Edits and bits are whole numbers: d <= t is d <= ⌊t⌋, d < t is d <= ⌈t⌉ − 1.
        (false, true) => threshold.floor(),
        (true, true) => threshold.ceil() - 1.0,
        (true, false) => threshold.next_down(),
    };
    Some((call, metric, threshold))
}

/// What `function` computes, for the functions the rule knows: simjoin's distance functions and
/// DataFusion's `array_distance` (`list_distance`) and `levenshtein`. A metric's distance orders
/// neighbours nearest first ascending, a dot product descending.
pub(super) fn formula(function: &str) -> Option<Formula> {
    match function {
        "array_distance" | "list_distance" => Some(Formula::Metric(Metric::L2)),
        "levenshtein" => Some(Formula::Metric(Metric::Levenshtein)),
        "jaccard_distance" => Some(Formula::Metric(Metric::Jaccard)),
        "hamming_distance" => Some(Formula::Metric(Metric::Hamming)),
        name => super::distance::formula(name),
    }
}

/// `WHERE dist(v, <constant>) <= r [AND …]` over one input as `range_query(input, constant, r)`
/// under a projection back to the input's columns (each base row within `r` once), the other
/// conjuncts as a filter above it.
fn rewrite_range(filter: &Filter, options: &SimJoinOptions) -> Option<LogicalPlan> {
    let ((column, constant, metric, threshold), rest) = take_conjunct(&filter.predicate, |c| {
        let (call, metric, threshold) = bounded_call(c)?;
        let (column, constant) = column_and_constant(call, filter.input.schema())?;
        Some((column, constant, metric, threshold))
    })?;
    let options = SimJoinOptions { metric, keys: String::new(), ..options.clone() };
    let base = view_input(&filter.input, &column, metric, "base")?;
    let query = query_input(constant, metric)?;
    let radius = checked_threshold(threshold, metric)?;
    let op = SimilarityOp { scalar_semantics: true, ..options.similarity_op(Operation::RangeQuery { radius }).ok()? };
    let table = super::table(op, query, Some(base), ["query", "base"], options.cluster).ok()?;
    let mut builder = scan_as(table, SCAN, filter.input.schema(), |_| "base_")?;
    if let Some(rest) = conjunction(rest) {
        builder = builder.filter(rest).ok()?;
    }
    builder.build().ok()
}

/// `ORDER BY dist(v, <constant>) [ASC] LIMIT n` (a dot product `DESC`), with the distance written
/// in the sort or computed by the projection below it: the sort's input becomes the rows of
/// `knn(input, constant, n)` together with every row the operator skips (NULL, NaN, ±∞, zero
/// under cosine), which SQL's order may place anywhere (a NULL distance last, a NaN with its sign
/// bit set first), and the sort and limit above pick the same rows from those as from all rows
/// (rows tied at the n-th distance are SQL's to choose either way).
fn rewrite_nearest(sort: &Sort, options: &SimJoinOptions) -> Option<LogicalPlan> {
    let n = sort.fetch?;
    let [key, more_keys @ ..] = sort.expr.as_slice() else { return None };
    // More sort keys break the distance's ties their own way: the candidates are every row at
    // the n-th distance or nearer (backend/plan/ties.rs), of which the sort keeps its n first.
    // Not on a cluster, whose tasks' lists merge to n.
    let ties = if more_keys.is_empty() { KnnTies::None } else { KnnTies::Kth };
    if ties != KnnTies::None && options.cluster {
        return None;
    }
    // The call, and the projection that computes it when the sort names its output column.
    let (call, projection) = match &key.expr {
        Expr::Column(column) => {
            let LogicalPlan::Projection(projection) = sort.input.as_ref() else { return None };
            let index = projection.schema.index_of_column(column).ok()?;
            (sort_call(&projection.expr[index])?, Some(projection))
        }
        other => (sort_call(other)?, None),
    };
    let metric = match (formula(call.func.name())?, key.asc) {
        (Formula::Metric(metric), true) => metric,
        (Formula::Dot, false) => Metric::InnerProduct,
        _ => return None,
    };
    let input = projection.map_or(&sort.input, |p| &p.input);
    // Already the candidates of an earlier pass of this rule (later passes merge its projections).
    let rewritten_before =
        |plan: &LogicalPlan| matches!(plan, LogicalPlan::TableScan(scan) if scan.table_name.table() == NEAREST);
    if sort.input.exists(|p| Ok(rewritten_before(p))).unwrap_or(true) {
        return None;
    }
    let (column, constant) = column_and_constant(call, input.schema())?;
    let options = SimJoinOptions { metric, keys: String::new(), ..options.clone() };
    let base = view_input(input, &column, metric, "base")?;
    let query = query_input(constant, metric)?;
    let op = SimilarityOp {
        scalar_semantics: true,
        approx: None,
        ties,
        ..options.similarity_op(Operation::Knn { k: n }).ok()?
    };
    let table = super::table(op, query, Some(base), ["query", "base"], options.cluster).ok()?;
    let candidates = scan_as(table, NEAREST, input.schema(), |_| "base_")?.build().ok()?;
    let sorted_input = match projection {
        Some(p) => LogicalPlan::Projection(Projection::try_new(p.expr.clone(), Arc::new(candidates)).ok()?),
        None => candidates,
    };
    Some(LogicalPlan::Sort(Sort { expr: sort.expr.clone(), input: Arc::new(sorted_input), fetch: sort.fetch }))
}

/// The function call a sort key orders by: the call itself, under an alias, or widened to Float64
/// (`CAST(levenshtein(w, 'x') AS DOUBLE)`: exact and order-preserving, so the same rows come first).
pub(super) fn sort_call(expr: &Expr) -> Option<&ScalarFunction> {
    match expr {
        Expr::Alias(alias) => sort_call(&alias.expr),
        Expr::Cast(cast) if *cast.field.data_type() == DataType::Float64 => sort_call(&cast.expr),
        Expr::ScalarFunction(call) => Some(call),
        _ => None,
    }
}

/// The first conjunct of `predicate` that `parse` accepts, parsed, and the other conjuncts.
fn take_conjunct<'a, T>(predicate: &'a Expr, parse: impl Fn(&'a Expr) -> Option<T>) -> Option<(T, Vec<Expr>)> {
    let conjuncts = split_conjunction(predicate);
    let (at, parsed) = conjuncts.iter().enumerate().find_map(|(i, c)| Some((i, parse(c)?)))?;
    let rest = conjuncts.iter().enumerate().filter(|(i, _)| *i != at).map(|(_, c)| (*c).clone()).collect();
    Some((parsed, rest))
}

/// A scan of the operator's table named `name` under a projection to `schema`: its column `i`
/// is the table's `prefix(i)` + its name (`left_v`, `base_id`), under its own qualified name.
pub(super) fn scan_as(
    table: Arc<crate::table::SimilarityTable>,
    name: &str,
    schema: &DFSchemaRef,
    prefix: impl Fn(usize) -> &'static str,
) -> Option<LogicalPlanBuilder> {
    let columns: Vec<Expr> = schema
        .iter()
        .enumerate()
        .map(|(i, (qualifier, field))| {
            Expr::Column(Column::new(Some(name), format!("{}{}", prefix(i), field.name())))
                .alias_qualified(qualifier.cloned(), field.name())
        })
        .collect();
    LogicalPlanBuilder::scan(name, provider_as_source(table), None).ok()?.project(columns).ok()
}

/// The column and the constant of `f(column, constant)` (either order), the column in `schema`.
fn column_and_constant<'a>(call: &'a ScalarFunction, schema: &DFSchemaRef) -> Option<(Column, &'a Expr)> {
    let [x, y] = call.args.as_slice() else { return None };
    let (column, constant) = match (x, y) {
        (_, Expr::Literal(..)) => (operand(x)?, y),
        (Expr::Literal(..), _) => (operand(y)?, x),
        _ => return None,
    };
    schema.has_column(&column).then_some((column, constant))
}

/// The constant query of a range query or kNN: a vector (an array literal, or text such as
/// `'[0.1, 0.2]'`) or, for the edit distance, a string. `None` for one the operator would skip
/// (non-finite values, the zero vector under cosine) — SQL compares every row with it.
fn query_input(constant: &Expr, metric: Metric) -> Option<TableInput> {
    let provider = match (metric.is_text(), constant) {
        (true, Expr::Literal(value, _)) => {
            let text = match value {
                ScalarValue::Utf8(Some(s)) | ScalarValue::LargeUtf8(Some(s)) | ScalarValue::Utf8View(Some(s)) => s,
                _ => return None,
            };
            super::args::text_table(vec![text.clone()]).ok()?
        }
        (false, _) => {
            let values = super::args::vector_literal("knn", "query", constant).ok()??;
            if metric == Metric::Cosine && values.iter().all(|v| *v == 0.0) {
                return None;
            }
            super::args::vector_table(values).ok()?
        }
        _ => return None,
    };
    let source = VectorSource::resolve(&provider.schema(), None, metric, "knn", "query").ok()?;
    Some(TableInput { provider, source, describe: "argument 'query'".to_string() })
}

/// `plan` as an input read by the operator, its vector (or text) column `column`; `None` when the
/// operator would not take it.
pub(super) fn view_input(plan: &LogicalPlan, column: &Column, metric: Metric, argument: &str) -> Option<TableInput> {
    let provider = Arc::new(ViewTable::new(plan.clone(), None));
    let index = plan.schema().index_of_column(column).ok()?;
    let name = plan.schema().field(index).name();
    let source = VectorSource::resolve(&provider.schema(), Some(name), metric, "sim_join", argument).ok()?;
    // A name the input holds twice (columns of an inner join) resolves to the first.
    (source.columns() == [index]).then(|| TableInput { provider, source, describe: format!("argument '{argument}'") })
}

/// The bound as the operator takes it, or `None` where it would reject it (SQL then returns no
/// row, or the rows its own comparison keeps): negative, or fractional for the edit distance. SQL's
/// `<=` orders -0.0 before 0.0 and the operator's does not, so -0.0 stays as it is too.
fn checked_threshold(threshold: f64, metric: Metric) -> Option<f64> {
    if threshold == 0.0 && threshold.is_sign_negative() {
        return None;
    }
    validate_threshold("sim_join", "eps", threshold, metric).ok()
}

/// A distance argument the operator reads as a column: the column itself, or a cast of it to a
/// list of Float64 or to another string type (the coercions DataFusion adds, such as a
/// FixedSizeList of Float32 to a List of Float64, which change no value, as the operator's own
/// widening does not). A narrowing cast (to Float32 elements) would change the values: not taken.
pub(super) fn operand(expr: &Expr) -> Option<Column> {
    match expr {
        Expr::Column(column) => Some(column.clone()),
        Expr::Cast(cast) => match cast.field.data_type() {
            DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _)
                if *f.data_type() == DataType::Float64 =>
            {
                operand(&cast.expr)
            }
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => operand(&cast.expr),
            _ => None,
        },
        _ => None,
    }
}

#[derive(PartialEq)]
pub(super) enum Side {
    Left,
    Right,
}

pub(super) fn side(join: &Join, column: &Column) -> Option<Side> {
    match (join.left.schema().has_column(column), join.right.schema().has_column(column)) {
        (true, false) => Some(Side::Left),
        (false, true) => Some(Side::Right),
        _ => None,
    }
}
