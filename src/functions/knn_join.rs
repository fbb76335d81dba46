//! kNN joins written with a window, planned as `knn` (part of the rule of `rewrite.rs`, switched
//! off with `SET simjoin.rewrite_joins = false`):
//!
//! ```sql
//! SELECT … FROM q CROSS JOIN b
//! QUALIFY ROW_NUMBER() OVER (PARTITION BY q.id ORDER BY l2_distance(q.v, b.v)) <= 10
//!
//! SELECT … FROM (SELECT …, ROW_NUMBER() OVER (PARTITION BY q.id ORDER BY l2_distance(q.v, b.v)) AS rn
//!                FROM q, b WHERE b.lang = 'en') WHERE rn <= 10
//! ```
//!
//! — any distance function the rule knows (a dot product `DESC`), the bound `<=`, `<`, `=` or
//! `BETWEEN`, and filters on either input, which DataFusion pushes below the join (so the k nearest
//! *among* the filtered base rows, as the SQL says). The cross join under the window becomes the
//! candidates of `knn(q, b, k)`; the window and the filter above stay as written and rank those.
//! An inner join on equality keys (`q JOIN b ON q.tenant = b.tenant`) becomes the candidates of
//! `knn(q, b, k, 'keys=…')`, each query's k nearest among the base rows of its key (exec/keyed.rs):
//! the argument below holds with B replaced by the base rows that share q's keys.
//!
//! Why the answer cannot change: the partition keys are expressions of the query side alone, so a
//! partition P is a set of query rows, each with every base row. Let T be the window's k first
//! rows of P × B under the order refined by knn's own tie-break (scan order); each pair (q, b) of
//! T is among q's k first pairs, since k pairs of q before it would rank it past k; so T lies
//! within the candidates C = ∪ knn(q). With T ⊆ C ⊆ P × B, C's k-th smallest distance is P × B's,
//! d*, and C holds every pair nearer than d*; the window's k first rows of C are therefore every
//! pair nearer than d* and some at d* — an answer of the SQL as written (rows tied at the k-th
//! distance are its to choose). The rows knn's contract skips are candidates too: each skipped
//! base row with every query, each skipped query with every base row (exec/run/odd_rows.rs,
//! `odd_candidates`): their distances are NULL or NaN, which SQL orders (NULLs last ascending,
//! first descending; a NaN with its sign bit set first) and the window computes itself.
//!
//! More ORDER BY keys after the distance (`ORDER BY dist, b.id`: a tie-break the lists do not
//! follow), RANK, and DENSE_RANK take lists widened to their ties (backend/plan/ties.rs): every
//! base row at the k-th distance (`ties=kth`; for DENSE_RANK, at one of the k smallest distinct
//! distances, `ties=distinct_distances`). Let D be P × B's k-th smallest distance (for DENSE_RANK
//! its k-th smallest distinct one). Every row the window keeps has distance ≤ D: k rows at D or
//! nearer precede (RANK, ROW_NUMBER) or k distinct distances ≤ D do (DENSE_RANK) any farther row.
//! A query q of P has fewer than k pairs (distinct distances) below D, so its k-th (distinct)
//! distance is at least D and its widened list holds every pair of q within D: C holds every row
//! the window can keep, with every row that precedes one. A row of C the window would not keep in
//! P × B is not kept in C either: a pair of P × B missing from C and preceding it lies beyond its
//! query's list, whose k rows (distinct distances) then precede it in C too. So the window ranks
//! each row of C it keeps exactly as over P × B.
//!
//! Left as planned: several window functions in one node, partition keys that read the base side,
//! a join condition between the two inputs (`WHERE q.id <> b.id`), and widened lists on a cluster
//! (its tasks' lists merge to k). DataFusion parses
//! `CROSS JOIN LATERAL (SELECT … ORDER BY dist(q.v, b.v) LIMIT k)` but cannot plan its outer
//! reference; the window form is the one to write.

use std::sync::Arc;

use datafusion::common::{Column, NullEquality, ScalarValue};
use datafusion::logical_expr::expr::WindowFunction;
use datafusion::logical_expr::utils::split_conjunction;
use datafusion::logical_expr::{BinaryExpr, Expr, Filter, JoinType, LogicalPlan, Operator};

use super::distance::Formula;
use super::rewrite::{Side, formula, keyed_inputs, operand, scan_as, side, sort_call, view_input};
use crate::op::{KnnTies, Metric, Operation, SimilarityOp};
use crate::options::SimJoinOptions;

/// The qualifier of a rewritten kNN join's candidate scan.
const KNN_JOIN: &str = "simjoin_knn_join";

/// `Filter(rn <= k) → [Projection] → Window(ROW_NUMBER) → [Projection] → cross join` (or inner
/// join on equality keys) with the join replaced by knn's candidates (the module's docs), or `None` when the plan is not of
/// that shape or the operator would not take its inputs.
pub(super) fn rewrite_knn_join(filter: &Filter, options: &SimJoinOptions) -> Option<LogicalPlan> {
    let (above, window) = match filter.input.as_ref() {
        LogicalPlan::Window(window) => (None, window),
        LogicalPlan::Projection(p) => match p.input.as_ref() {
            LogicalPlan::Window(window) => (Some(filter.input.as_ref()), window),
            _ => return None,
        },
        _ => return None,
    };
    let (below, join) = match window.input.as_ref() {
        LogicalPlan::Join(join) => (None, join),
        LogicalPlan::Projection(p) => match p.input.as_ref() {
            LogicalPlan::Join(join) => (Some(p), join),
            _ => return None,
        },
        _ => return None,
    };
    // Equality keys (`q JOIN b ON q.tenant = b.tenant`) make it a kNN within each key's group;
    // not on a cluster, where the operator does not take them.
    let keyed = !join.on.is_empty();
    if join.join_type != JoinType::Inner
        || join.null_equality != NullEquality::NullEqualsNothing
        || join.filter.is_some()
        || (keyed && options.cluster)
    {
        return None;
    }
    let [window_expr] = window.window_expr.as_slice() else { return None };
    let Expr::WindowFunction(function) = unaliased(window_expr) else { return None };
    let WindowFunction { fun, params } = function.as_ref();
    if params.filter.is_some() || params.distinct {
        return None;
    }
    // A row number by the distance alone takes knn's lists as they are; more sort keys, or a rank
    // that keeps every row tied at the k-th, take the lists widened to their ties (module docs).
    let ties = match (fun.name(), params.order_by.len()) {
        ("row_number", 1) => KnnTies::None,
        ("row_number" | "rank", _) => KnnTies::Kth,
        ("dense_rank", _) => KnnTies::Distinct,
        _ => return None,
    };
    // On a cluster the tasks' lists merge to k a query.
    if ties != KnnTies::None && options.cluster {
        return None;
    }
    let [key, ..] = params.order_by.as_slice() else { return None };

    // The row number's column as the filter sees it, and the smallest upper bound put on it.
    let number = window.schema.qualified_field(window.input.schema().fields().len());
    let mut number = Column::from(number);
    if let Some(LogicalPlan::Projection(p)) = above {
        let at = p.expr.iter().position(|e| matches!(unaliased(e), Expr::Column(c) if *c == number))?;
        number = Column::from(p.schema.qualified_field(at));
    }
    let k = split_conjunction(&filter.predicate).into_iter().filter_map(|c| upper_bound(c, &number)).min()?;

    // The distance the window orders by: written in the window, or computed by the projection
    // under it.
    let call = match &key.expr {
        Expr::Column(column) => {
            let projection = below?;
            sort_call(&projection.expr[projection.schema.index_of_column(column).ok()?])?
        }
        other => sort_call(other)?,
    };
    let metric = match (formula(call.func.name())?, key.asc) {
        (Formula::Metric(metric), true) => metric,
        (Formula::Dot, false) => Metric::InnerProduct,
        _ => return None,
    };
    let [x, y] = call.args.as_slice() else { return None };
    let (x, y) = (operand(x)?, operand(y)?);
    let (x_side, y_side) = (side(join, &x)?, side(join, &y)?);
    if x_side == y_side {
        return None;
    }
    // The query side is the one the partition keys read (the left one where there are none),
    // through the projection under the window where there is one.
    let mut keys = Vec::new();
    for column in params.partition_by.iter().flat_map(|e| e.column_refs()) {
        match below {
            None => keys.push(column.clone()),
            Some(p) => keys.extend(p.expr[p.schema.index_of_column(column).ok()?].column_refs().into_iter().cloned()),
        }
    }
    let query_side = match keys.first() {
        None => Side::Left,
        Some(first) => side(join, first)?,
    };
    if !keys.iter().all(|c| side(join, c).as_ref() == Some(&query_side)) {
        return None;
    }
    let (query, base) = if x_side == query_side { (x, y) } else { (y, x) };
    let (keys, [left_plan, right_plan]) = keyed_inputs(join)?;
    let (query_plan, base_plan) = match query_side {
        Side::Left => (left_plan, right_plan),
        Side::Right => (right_plan, left_plan),
    };

    let options = SimJoinOptions { metric, keys: keys.join(" "), ..options.clone() };
    let query = view_input(&query_plan, &query, metric, "query")?;
    let base = view_input(&base_plan, &base, metric, "base")?;
    let op = SimilarityOp {
        scalar_semantics: true,
        approx: None,
        ties,
        ..options.similarity_op(Operation::Knn { k: usize::try_from(k).ok()? }).ok()?
    };
    let table = super::table(op, query, Some(base), ["query", "base"], options.cluster).ok()?;
    // The join's columns in order: the left input's, then the right's.
    let left_len = join.left.schema().fields().len();
    let prefix = |i: usize| match (i < left_len, &query_side) {
        (true, Side::Left) | (false, Side::Right) => "query_",
        _ => "base_",
    };
    let mut plan = scan_as(table, KNN_JOIN, &join.schema, prefix)?.build().ok()?;
    // The nodes over the join again, each over the rewritten one below it.
    let nodes =
        [below.map(|p| LogicalPlan::Projection(p.clone())), Some(LogicalPlan::Window(window.clone())), above.cloned()];
    for node in nodes.into_iter().flatten() {
        plan = node.with_new_exprs(node.expressions(), vec![plan]).ok()?;
    }
    Some(LogicalPlan::Filter(Filter::try_new(filter.predicate.clone(), Arc::new(plan)).ok()?))
}

fn unaliased(expr: &Expr) -> &Expr {
    match expr {
        Expr::Alias(alias) => unaliased(&alias.expr),
        other => other,
    }
}

/// The largest row number `conjunct` keeps, where it bounds `number` from above by a constant
/// (`rn <= 10`, `rn < 11`, `10 >= rn`, `rn = 10`); `BETWEEN` arrives as two conjuncts.
fn upper_bound(conjunct: &Expr, number: &Column) -> Option<u64> {
    let Expr::BinaryExpr(BinaryExpr { left, op, right }) = conjunct else { return None };
    let (op, constant) = match (left.as_ref(), right.as_ref()) {
        (Expr::Column(c), Expr::Literal(value, _)) if c == number => (*op, value),
        (Expr::Literal(value, _), Expr::Column(c)) if c == number => (op.swap()?, value),
        _ => return None,
    };
    let ScalarValue::Int64(Some(bound)) = constant.cast_to(&datafusion::arrow::datatypes::DataType::Int64).ok()? else {
        return None;
    };
    let k = match op {
        Operator::LtEq | Operator::Eq => bound,
        Operator::Lt => bound - 1,
        _ => return None,
    };
    // Row numbers start at 1: a bound below keeps no row, which SQL answers without the operator.
    u64::try_from(k).ok().filter(|&k| k >= 1)
}

#[cfg(test)]
mod tests {
    use datafusion::common::Column;
    use datafusion::logical_expr::{col, lit};

    use super::upper_bound;

    #[test]
    fn bounds_on_the_row_number() {
        let rn = Column::from_name("rn");
        assert_eq!(upper_bound(&col("rn").lt_eq(lit(10u64)), &rn), Some(10));
        assert_eq!(upper_bound(&col("rn").lt(lit(10i64)), &rn), Some(9));
        assert_eq!(upper_bound(&lit(4).gt_eq(col("rn")), &rn), Some(4));
        assert_eq!(upper_bound(&col("rn").eq(lit(1)), &rn), Some(1));
        assert_eq!(upper_bound(&col("rn").gt_eq(lit(3)), &rn), None);
        assert_eq!(upper_bound(&col("rn").lt(lit(1)), &rn), None);
        assert_eq!(upper_bound(&col("other").lt_eq(lit(3)), &rn), None);
    }
}
