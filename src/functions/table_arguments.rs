//! Table arguments that only the SQL planner can resolve: a CTE's name (`WITH d AS (…) SELECT *
//! FROM knn(d, q, 2)`) and a subquery (`knn((SELECT * FROM docs WHERE cat = 2), q, 3)`).
//! DataFusion hands a table function its arguments as expressions planned against an empty
//! schema, without the statement's CTEs, and refuses a subquery of more than one column; this
//! relation planner plans such arguments itself, as the relations they are, and passes each to
//! the function as its plan (read through a view, as a `CREATE VIEW` would be). Calls with neither
//! are left to DataFusion's own planning.

use std::sync::Arc;

use datafusion::common::{DFSchema, Result, Spans, TableReference, plan_err};
use datafusion::logical_expr::planner::{PlannedRelation, RelationPlanner, RelationPlannerContext, RelationPlanning};
use datafusion::logical_expr::{Expr, LogicalPlan, LogicalPlanBuilder, Subquery};
use datafusion::sql::sqlparser::ast::{Expr as SqlExpr, FunctionArg, FunctionArgExpr, ObjectName, TableFactor};

/// Plans the CTE and subquery arguments of simjoin's table functions.
#[derive(Debug, Default)]
pub struct TableArgumentPlanner;

/// How many leading arguments can name a table (a join's two inputs; a kNN's base and queries).
const TABLE_POSITIONS: usize = 2;

impl RelationPlanner for TableArgumentPlanner {
    fn plan_relation(
        &self,
        relation: TableFactor,
        context: &mut dyn RelationPlannerContext,
    ) -> Result<RelationPlanning> {
        let TableFactor::Table { name, args: Some(args), .. } = &relation else {
            return Ok(RelationPlanning::Original(Box::new(relation)));
        };
        let function = match name.0.as_slice() {
            [part] => part.as_ident().map(|ident| ident.value.clone()),
            _ => None,
        };
        let Some(function) = function.filter(|f| super::all().iter().any(|(name, _)| name == f)) else {
            return Ok(RelationPlanning::Original(Box::new(relation)));
        };
        let mut plans = Vec::with_capacity(args.args.len());
        for (position, arg) in args.args.iter().enumerate() {
            plans.push(match arg {
                FunctionArg::Unnamed(FunctionArgExpr::Expr(expr)) => table_plan(expr, position, context),
                _ => None,
            });
        }
        if plans.iter().all(Option::is_none) {
            return Ok(RelationPlanning::Original(Box::new(relation)));
        }
        let TableFactor::Table { alias, args: Some(args), .. } = relation else {
            return plan_err!("{function}: expected a table function call");
        };
        let mut exprs = Vec::with_capacity(plans.len());
        for (arg, plan) in args.args.into_iter().zip(plans) {
            exprs.push(match (arg, plan) {
                (_, Some(plan)) => Expr::ScalarSubquery(Subquery {
                    subquery: Arc::new(plan),
                    outer_ref_columns: Vec::new(),
                    spans: Spans::new(),
                }),
                (FunctionArg::Unnamed(FunctionArgExpr::Expr(expr)), None) => {
                    context.sql_expr_to_logical_expr(expr, &DFSchema::empty())?
                }
                (other, None) => return plan_err!("{function}: unsupported argument {other}"),
            });
        }
        let source = context.context_provider().get_table_function_source(&function, exprs)?;
        let plan = LogicalPlanBuilder::scan(TableReference::bare(format!("{function}()")), source, None)?.build()?;
        Ok(RelationPlanning::Planned(Box::new(PlannedRelation::new(plan, alias))))
    }
}

/// The plan of an argument the function cannot resolve itself: a subquery, or, in a table
/// position, a name that the statement's CTEs define (the planner resolves a name to a CTE before
/// the catalog, as SQL does). A name of the catalog plans as a scan of it, left to the function,
/// which reads its tables as they are (in-memory tables keep their vectors across queries); a name
/// the planner cannot resolve is left too, for the function's own error.
fn table_plan(expr: &SqlExpr, position: usize, context: &mut dyn RelationPlannerContext) -> Option<LogicalPlan> {
    match expr {
        SqlExpr::Subquery(query) => {
            let derived = TableFactor::Derived { lateral: false, subquery: query.clone(), alias: None, sample: None };
            // A subquery that does not plan is a scalar argument's business: the function says why.
            context.plan(derived).ok()
        }
        SqlExpr::Identifier(_) | SqlExpr::CompoundIdentifier(_) if position < TABLE_POSITIONS => {
            let parts = match expr {
                SqlExpr::Identifier(ident) => vec![ident.clone()],
                SqlExpr::CompoundIdentifier(idents) => idents.clone(),
                _ => return None,
            };
            let table = TableFactor::Table {
                name: ObjectName::from(parts),
                alias: None,
                args: None,
                with_hints: Vec::new(),
                version: None,
                with_ordinality: false,
                partitions: Vec::new(),
                json_path: None,
                sample: None,
                index_hints: Vec::new(),
            };
            context.plan(table).ok().filter(|plan| !matches!(plan, LogicalPlan::TableScan(_)))
        }
        _ => None,
    }
}
