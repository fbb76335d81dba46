//! `range_query(base, query, r [, options])`: every base row within `r` of each query row; `query`
//! is a table or a constant vector such as `'[0.1, 0.2]'`.

use std::sync::Arc;

use datafusion::catalog::{TableFunctionArgs, TableFunctionImpl, TableProvider};
use datafusion::common::{Result, plan_err};

use super::args;
use crate::op::{Operation, validate_threshold};

/// The range-query table function.
#[derive(Debug, Default)]
pub struct RangeQueryFunc;

impl TableFunctionImpl for RangeQueryFunc {
    fn call_with_args(&self, call: TableFunctionArgs) -> Result<Arc<dyn TableProvider>> {
        const F: &str = "range_query";
        let [base, query, r, rest @ ..] = call.exprs() else {
            return plan_err!(
                "{F}: expected range_query(base, query, r [, options]), got {} arguments",
                call.exprs().len()
            );
        };
        let options = args::options(call.session(), F, rest)?;
        let radius = validate_threshold(F, "r", args::number_arg(F, "r", r)?, options.metric)?;
        let op = options.similarity_op(Operation::RangeQuery { radius })?;
        let (base, query) = super::query_and_base(call.session(), F, base, query, &options)?;
        Ok(super::table(op, query, Some(base), ["query", "base"], options.cluster)?)
    }
}
