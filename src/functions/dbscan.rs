//! `dbscan(t, eps, min_points [, options])`: each row of `t` with its cluster (`cluster_id`, the
//! input row of the cluster's first core row in scan order; NULL for noise) and whether it is a
//! core row (`core`), by DBSCAN over the ε-graph of any metric (backend/clusters.rs).
//! `min_points` = 1 gives the connected components of the ε-graph. With `keys`, rows are within ε
//! only where their keys are equal (each key's rows clustered alone, exec/keyed.rs); a row of a
//! NULL key is noise.

use std::sync::Arc;

use datafusion::catalog::{TableFunctionArgs, TableFunctionImpl, TableProvider};
use datafusion::common::{Result, plan_err};

use super::args;
use crate::op::{Operation, validate_threshold};
use crate::table::{CLUSTER_ID, CORE};

/// The clustering table function.
#[derive(Debug, Default)]
pub struct DbscanFunc;

impl TableFunctionImpl for DbscanFunc {
    fn call_with_args(&self, call: TableFunctionArgs) -> Result<Arc<dyn TableProvider>> {
        const F: &str = "dbscan";
        let [table, eps, min_points, rest @ ..] = call.exprs() else {
            return plan_err!(
                "{F}: expected dbscan(table, eps, min_points [, options]) (min_points = 1: connected components), got {} arguments",
                call.exprs().len()
            );
        };
        let options = args::options(call.session(), F, rest)?;
        let eps = validate_threshold(F, "eps", args::number_arg(F, "eps", eps)?, options.metric)?;
        let min_points = args::count_arg(F, "min_points", min_points)?;
        let op = options.similarity_op(Operation::Clusters { eps, min_points })?;
        let input = super::input(call.session(), F, "table", &args::table_arg(F, "table", table)?, &options)?;
        if let Some(taken) =
            [CLUSTER_ID, CORE].into_iter().find(|c| input.provider.schema().column_with_name(c).is_some())
        {
            return plan_err!(
                "{F}: argument 'table' has a column '{taken}', which dbscan adds; select the input's columns under other names"
            );
        }
        if options.cluster {
            return plan_err!(
                "{F}: a clustering does not run on a cluster yet (its components span the tasks' shares); run it in one process"
            );
        }
        Ok(super::table(op, input, None, ["table", "table"], false)?)
    }
}
