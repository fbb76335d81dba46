//! `sim_join(t, eps [, options])` and `sim_join(a, b, eps [, options])`: every pair of rows whose
//! vectors are within `eps`.

use std::sync::Arc;

use datafusion::catalog::{TableFunctionArgs, TableFunctionImpl, TableProvider};
use datafusion::common::{Result, internal_err, plan_err};

use super::args::{self, is_number};
use crate::op::{Operation, validate_threshold};

/// The ε-join table function.
#[derive(Debug, Default)]
pub struct SimJoinFunc;

impl TableFunctionImpl for SimJoinFunc {
    fn call_with_args(&self, call: TableFunctionArgs) -> Result<Arc<dyn TableProvider>> {
        const F: &str = "sim_join";
        let exprs = call.exprs();
        let self_join = exprs.len() >= 2 && is_number(&exprs[1]);
        let (tables, eps, rest) = match exprs {
            [t, eps, rest @ ..] if self_join => (vec![("table", t)], eps, rest),
            [a, b, eps, rest @ ..] => (vec![("left", a), ("right", b)], eps, rest),
            _ => {
                return plan_err!(
                    "{F}: expected sim_join(table, eps [, options]) or sim_join(left, right, eps [, options]), \
                     got {} arguments",
                    exprs.len()
                );
            }
        };
        let options = args::options(call.session(), F, rest)?;
        let eps = validate_threshold(F, "eps", args::number_arg(F, "eps", eps)?, options.metric)?;
        let operation = Operation::SimJoin { eps, self_join, include_self: options.include_self, pairs: options.pairs };
        let op = options.similarity_op(operation)?;
        let mut inputs = tables
            .iter()
            .map(|(name, expr)| {
                let table = args::table_arg(F, name, expr)?;
                super::input(call.session(), F, name, &table, &options)
            })
            .collect::<Result<Vec<_>>>()?
            .into_iter();
        let Some(first) = inputs.next() else {
            return internal_err!("{F}: no table argument was parsed");
        };
        Ok(super::table(op, first, inputs.next(), ["left", "right"], options.cluster)?)
    }
}
