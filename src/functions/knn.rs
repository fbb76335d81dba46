//! `knn(base, query, k [, options])`: the `k` nearest base rows of each query row, with `rank`
//! 1 = nearest; `query` is a table or a constant vector such as `'[0.1, 0.2]'`.

use std::sync::Arc;

use datafusion::catalog::{TableFunctionArgs, TableFunctionImpl, TableProvider};
use datafusion::common::{Result, plan_err};

use super::args;
use crate::op::Operation;

/// The k-nearest-neighbour table function.
#[derive(Debug, Default)]
pub struct KnnFunc;

impl TableFunctionImpl for KnnFunc {
    fn call_with_args(&self, call: TableFunctionArgs) -> Result<Arc<dyn TableProvider>> {
        const F: &str = "knn";
        let [base, query, k, rest @ ..] = call.exprs() else {
            return plan_err!("{F}: expected knn(base, query, k [, options]), got {} arguments", call.exprs().len());
        };
        let options = args::options(call.session(), F, rest)?;
        let k = args::count_arg(F, "k", k)?;
        let op = options.similarity_op(Operation::Knn { k })?;
        let (base, query) = super::query_and_base(call.session(), F, base, query, &options)?;
        Ok(super::table(op, query, Some(base), ["query", "base"], options.cluster)?)
    }
}
