//! What a served statement may do: by default only read (queries, `EXPLAIN`, `SHOW`, `DESCRIBE`,
//! prepared queries, the catalog calls); DDL, DML, `COPY` and statements such as `SET` only with
//! writes allowed.
//!
//! Two checks, so that no path escapes: the service refuses a statement from its syntax before
//! planning it, with a `PermissionDenied` that names its kind, and the crate's service verifies
//! every SQL plan it builds (including those of prepared-statement handles, which a client could
//! forge) with [`SQLOptions`]. Substrait plans bypass that verification in the crate, so the
//! service decodes them and applies the same [`SQLOptions`] itself.

use datafusion::execution::context::{SQLOptions, SessionState};
use datafusion::logical_expr::LogicalPlan;
use datafusion::sql::parser::Statement as DFStatement;
use datafusion::sql::sqlparser::ast::{SetExpr, Statement};
use tonic::Status;

use super::files::{DataRoots, check_named_path};

/// Whether served statements may change anything outside themselves.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Access {
    /// Queries only (the default).
    #[default]
    ReadOnly,
    /// DDL, DML, `COPY` and `SET` too: tables a client creates, drops or writes are those every
    /// client sees, and `COPY … TO` writes files inside the data directories.
    ReadWrite,
}

impl Access {
    /// The options the crate's service verifies every SQL plan with.
    pub(super) fn sql_options(self) -> SQLOptions {
        let writes = self == Access::ReadWrite;
        SQLOptions::new().with_allow_ddl(writes).with_allow_dml(writes).with_allow_statements(writes)
    }

    /// Refuses `sql` when it would write on a read-only server, or names a file outside the data
    /// roots; SQL that does not parse is left to the service, which reports the syntax error.
    pub(super) fn check_sql(self, state: &SessionState, roots: &DataRoots, sql: &str) -> Result<(), Status> {
        let dialect = state.config().options().sql_parser.dialect;
        let Ok(statement) = state.sql_to_statement(sql, &dialect) else { return Ok(()) };
        if self == Access::ReadOnly
            && let Some(kind) = writing_kind(&statement)
        {
            return Err(refusal(&kind));
        }
        named_paths(&statement).into_iter().try_for_each(|path| check_named_path(roots, path))
    }

    /// The refusal of a plan (from Substrait) that would write.
    pub(super) fn check_plan(self, plan: &LogicalPlan) -> Result<(), Status> {
        self.sql_options().verify_plan(plan).map_err(|e| refusal(e.message().as_ref()))
    }
}

/// The files a statement names outside its queries: `COPY`'s target and `CREATE EXTERNAL TABLE`'s
/// location (path arguments of table functions are checked by the confined store as they are read).
fn named_paths(statement: &DFStatement) -> Vec<&str> {
    match statement {
        DFStatement::CopyTo(copy) => vec![copy.target.as_str()],
        DFStatement::CreateExternalTable(create) => create.locations.iter().map(String::as_str).collect(),
        DFStatement::Explain(explain) => named_paths(&explain.statement),
        DFStatement::Statement(_) | DFStatement::Reset(_) => Vec::new(),
    }
}

fn refusal(kind: &str) -> Status {
    Status::permission_denied(format!(
        "simjoin server: {kind} is not allowed: this server is read-only (it accepts queries; \
         start it with --allow-writes to permit DDL, DML, COPY and SET)"
    ))
}

/// The kind of a statement that writes (`COPY`, `CREATE EXTERNAL TABLE`, `INSERT`, `DROP`, `SET`,
/// …), or `None` for one that only reads.
fn writing_kind(statement: &DFStatement) -> Option<String> {
    match statement {
        DFStatement::Statement(statement) => sql_writing_kind(statement),
        DFStatement::CreateExternalTable(_) => Some("CREATE EXTERNAL TABLE".into()),
        DFStatement::CopyTo(_) => Some("COPY".into()),
        DFStatement::Reset(_) => Some("RESET".into()),
        // EXPLAIN ANALYZE runs its statement; a plain EXPLAIN of a write is refused all the same.
        DFStatement::Explain(explain) => writing_kind(&explain.statement),
    }
}

fn sql_writing_kind(statement: &Statement) -> Option<String> {
    match statement {
        Statement::Query(query) => match query.body.as_ref() {
            SetExpr::Select(select) if select.into.is_some() => Some("SELECT INTO".into()),
            _ => None,
        },
        Statement::Explain { statement, .. } => sql_writing_kind(statement),
        Statement::ExplainTable { .. } => None,
        other => {
            // The AST variant's name (`CreateTable`, `Insert`, `SetVariable`) as SQL words.
            let debug = format!("{other:?}");
            let name: String = debug.chars().take_while(char::is_ascii_alphanumeric).collect();
            if name.starts_with("Show") {
                return None;
            }
            let mut words = String::new();
            for c in name.chars() {
                if c.is_ascii_uppercase() && !words.is_empty() {
                    words.push(' ');
                }
                words.push(c.to_ascii_uppercase());
            }
            Some(words)
        }
    }
}

#[cfg(test)]
mod tests {
    use datafusion::prelude::SessionContext;

    use crate::server::policy::writing_kind;

    fn kind(sql: &str) -> Option<String> {
        let state = SessionContext::new().state();
        let dialect = state.config().options().sql_parser.dialect;
        writing_kind(&state.sql_to_statement(sql, &dialect).unwrap())
    }

    #[test]
    fn reads_pass_and_writes_are_named() {
        for read in [
            "SELECT 1",
            "SELECT * FROM knn(t, q, 3)",
            "WITH a AS (SELECT 1) SELECT * FROM a",
            "EXPLAIN SELECT 1",
            "EXPLAIN ANALYZE SELECT 1",
            "SHOW TABLES",
            "SHOW ALL",
            "DESCRIBE t",
        ] {
            assert_eq!(kind(read), None, "{read}");
        }
        for (write, expected) in [
            ("COPY (SELECT 1 AS x) TO '/tmp/x.csv' STORED AS CSV", "COPY"),
            ("CREATE EXTERNAL TABLE e STORED AS CSV LOCATION '/etc/os-release'", "CREATE EXTERNAL TABLE"),
            ("CREATE TABLE t AS SELECT 1", "CREATE TABLE"),
            ("CREATE VIEW v AS SELECT 1", "CREATE VIEW"),
            ("DROP TABLE p", "DROP"),
            ("INSERT INTO t VALUES (1)", "INSERT"),
            ("SET datafusion.execution.batch_size = 1", "SET"),
            ("SELECT 1 INTO t", "SELECT INTO"),
            ("EXPLAIN ANALYZE COPY (SELECT 1) TO '/tmp/y.csv'", "COPY"),
            ("EXPLAIN INSERT INTO t VALUES (1)", "INSERT"),
        ] {
            assert_eq!(kind(write).as_deref(), Some(expected), "{write}");
        }
    }
}
