//! Plain SQL planned as the similarity operator: an optimizer rule (registered by
//! `simjoin::register`, switched off with `SET simjoin.rewrite_joins = false`) that plans
//!
//! ```sql
//! SELECT … FROM a JOIN b ON l2_distance(a.v, b.v) <= 0.5 [AND …]
//! ```
//!
//! — the distance functions of `distance.rs`, DataFusion's `array_distance` (`list_distance`) and
//! `levenshtein`, either argument order, `<=` or `<`, the constant on either side; a dot product
//! (`inner_product`, `array_inner_product`) bounded from below as `metric=inner_product` — as
//! `sim_join(a, b, 0.5, 'metric=…, column=v')` with the join's other conjuncts as a filter above it.
//!
//! Why the answer cannot change: the operator keeps a pair iff its distance, by the same f64
//! formula (or the same edit distance), is `<=` the threshold; `d < t` is `d <= t⁻` for the
//! largest float `t⁻` below `t` (and `d <= ⌈t⌉ − 1` for whole-number edit distances). The rows its
//! contract skips are NULL vectors and vectors holding a NULL — whose scalar distance is NULL,
//! which no condition keeps — and, not NULL, vectors holding NaN or ±∞ and zero vectors under
//! cosine. Their scalar distances can be NaN, and SQL's `<=` orders floats totally, so a NaN with
//! its sign bit set (what `0/0` and `∞ − ∞` give on x86) passes any bound; L∞'s maximum ignores a
//! NaN coordinate. So the rewritten operator runs with `SimilarityOp::scalar_semantics`: those
//! rows too are compared, by the scalar formula, and kept as SQL keeps them. Joins with equality
//! keys, outer joins, disjunctions, a distance bounded from below, a narrowing cast of an
//! argument, a threshold of -0.0, and any join whose inputs the operator
//! would reject (no list column, a text column under a vector metric): a rewrite never turns a
//! valid query into an error.

use std::sync::Arc;

use datafusion::arrow::datatypes::DataType;
use datafusion::catalog::TableProvider;
use datafusion::catalog::view::ViewTable;
use datafusion::common::tree_node::Transformed;
use datafusion::common::{Column, Result, ScalarValue};
use datafusion::datasource::provider_as_source;
use datafusion::logical_expr::utils::{conjunction, split_conjunction};
use datafusion::logical_expr::{BinaryExpr, Expr, Join, JoinType, LogicalPlan, LogicalPlanBuilder, Operator};
use datafusion::optimizer::optimizer::ApplyOrder;
use datafusion::optimizer::{OptimizerConfig, OptimizerRule};

use crate::op::{Metric, Operation, PairOrder, SimilarityOp, validate_threshold};
use crate::options::SimJoinOptions;
use crate::table::TableInput;
use crate::vectors::VectorSource;

/// The qualifier of the rewritten join's scan.
const SCAN: &str = "simjoin_join";

/// The rule; see the module docs.
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
        let options = config.options().extensions.get::<SimJoinOptions>().cloned().unwrap_or_default();
        if !options.rewrite_joins {
            return Ok(Transformed::no(plan));
        }
        let LogicalPlan::Join(join) = &plan else { return Ok(Transformed::no(plan)) };
        match rewrite_join(join, &options) {
            Some(rewritten) => Ok(Transformed::yes(rewritten)),
            None => Ok(Transformed::no(plan)),
        }
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
    if join.join_type != JoinType::Inner || !join.on.is_empty() {
        return None;
    }
    let conjuncts = split_conjunction(join.filter.as_ref()?);
    let (at, bound) = conjuncts.iter().enumerate().find_map(|(i, c)| Some((i, distance_bound(c, join)?)))?;
    let rest: Vec<Expr> = conjuncts.iter().enumerate().filter(|(i, _)| *i != at).map(|(_, c)| (*c).clone()).collect();

    let options = SimJoinOptions { metric: bound.metric, ..options.clone() };
    let input = |plan: &LogicalPlan, column: &Column, argument: &str| -> Option<TableInput> {
        let provider = Arc::new(ViewTable::new(plan.clone(), None));
        let index = plan.schema().index_of_column(column).ok()?;
        let name = plan.schema().field(index).name();
        let schema = provider.schema();
        let source = VectorSource::resolve(&schema, Some(name), bound.metric.is_text(), "sim_join", argument).ok()?;
        // A name the input holds twice (columns of an inner join) resolves to the first.
        (source.columns() == [index]).then(|| TableInput {
            provider,
            source,
            describe: format!("argument '{argument}'"),
        })
    };
    let left = input(&join.left, &bound.left, "left")?;
    let right = input(&join.right, &bound.right, "right")?;
    // SQL's `<=` orders -0.0 before 0.0, the operator's does not: a bound of -0.0 stays as it is.
    if bound.threshold == 0.0 && bound.threshold.is_sign_negative() {
        return None;
    }
    let eps = validate_threshold("sim_join", "eps", bound.threshold, bound.metric).ok()?;
    let operation = Operation::SimJoin { eps, self_join: false, include_self: false, pairs: PairOrder::Ordered };
    let op = SimilarityOp { scalar_semantics: true, ..super::similarity_op(operation, &options) };
    let table = super::table(op, left, Some(right), ["left", "right"]).ok()?;

    // The join's columns in order: the left input's, then the right's, each under its own name.
    let left_len = join.left.schema().fields().len();
    let columns: Vec<Expr> = join
        .schema
        .iter()
        .enumerate()
        .map(|(i, (qualifier, field))| {
            let prefix = if i < left_len { "left_" } else { "right_" };
            Expr::Column(Column::new(Some(SCAN), format!("{prefix}{}", field.name())))
                .alias_qualified(qualifier.cloned(), field.name())
        })
        .collect();
    let mut builder = LogicalPlanBuilder::scan(SCAN, provider_as_source(table), None).ok()?.project(columns).ok()?;
    if let Some(filter) = conjunction(rest) {
        builder = builder.filter(filter).ok()?;
    }
    builder.build().ok()
}

/// `conjunct` as a distance bound between the join's two sides.
fn distance_bound(conjunct: &Expr, join: &Join) -> Option<DistanceBound> {
    let Expr::BinaryExpr(BinaryExpr { left, op, right }) = conjunct else { return None };
    // `f(x, y) op t`, or `t op f(x, y)` read the other way round.
    let (call, op, constant) = match (left.as_ref(), right.as_ref()) {
        (Expr::ScalarFunction(call), Expr::Literal(value, _)) => (call, *op, value),
        (Expr::Literal(value, _), Expr::ScalarFunction(call)) => (call, op.swap()?, value),
        _ => return None,
    };
    let threshold = match constant.cast_to(&DataType::Float64).ok()? {
        ScalarValue::Float64(Some(t)) if t.is_finite() => t,
        _ => return None,
    };
    // The metric, the bound on its distance, and whether the bound is strict. A dot product
    // bounded from below is the negative inner product bounded from above: negation reverses
    // SQL's total order exactly.
    let (metric, threshold, strict) = match (call.func.name(), op) {
        ("inner_product" | "array_inner_product", Operator::GtEq | Operator::Gt) => {
            (Metric::InnerProduct, -threshold, op == Operator::Gt)
        }
        (name, Operator::LtEq | Operator::Lt) => {
            let metric = match name {
                "l2_distance" | "array_distance" | "list_distance" => Metric::L2,
                "l2sq_distance" => Metric::L2Squared,
                "cosine_distance" | "array_cosine_distance" => Metric::Cosine,
                "l1_distance" => Metric::L1,
                "linf_distance" => Metric::LInf,
                "array_negative_inner_product" => Metric::InnerProduct,
                "levenshtein" => Metric::Levenshtein,
                _ => return None,
            };
            (metric, threshold, op == Operator::Lt)
        }
        _ => return None,
    };
    let [x, y] = call.args.as_slice() else { return None };
    let (x, y) = (operand(x)?, operand(y)?);
    let (left, right) = match (side(join, &x)?, side(join, &y)?) {
        (Side::Left, Side::Right) => (x, y),
        (Side::Right, Side::Left) => (y, x),
        _ => return None,
    };
    let threshold = match (strict, metric.is_text()) {
        (false, _) => threshold,
        // Edit distances are whole numbers: d < t is d <= ⌈t⌉ − 1.
        (true, true) => threshold.ceil() - 1.0,
        (true, false) => threshold.next_down(),
    };
    Some(DistanceBound { metric, left, right, threshold })
}

/// A distance argument the operator reads as a column: the column itself, or a cast of it to a
/// list of Float64 or to another string type (the coercions DataFusion adds, such as a
/// FixedSizeList of Float32 to a List of Float64, which change no value, as the operator's own
/// widening does not). A narrowing cast (to Float32 elements) would change the values: not taken.
fn operand(expr: &Expr) -> Option<Column> {
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
enum Side {
    Left,
    Right,
}

fn side(join: &Join, column: &Column) -> Option<Side> {
    match (join.left.schema().has_column(column), join.right.schema().has_column(column)) {
        (true, false) => Some(Side::Left),
        (false, true) => Some(Side::Right),
        _ => None,
    }
}
