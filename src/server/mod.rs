//! Arrow Flight SQL server: a simjoin session served with the maintained
//! [`datafusion_flight_sql_server`] service (statements, prepared statements with parameters,
//! catalog metadata), behind tonic's TLS and an authentication check.
//!
//! A client with valid credentials may query the served tables and nothing more, unless the server
//! says otherwise: statements are read-only ([`Access`]), files are reachable only inside the data
//! directories and the served tables' own files ([`DataRoots`]), every request runs on a copy of
//! the session's state (a client cannot change what another sees), and each query runs under
//! [`QueryLimits`]. The crate's service refuses the `Handshake`, which is how clients with a user
//! name and password (ADBC, JDBC, `FlightSqlServiceClient::handshake`) obtain a bearer token, so
//! the service here answers it.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use arrow_flight::flight_service_server::FlightServiceServer;
use datafusion::datasource::listing::ListingTable;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::SessionStateBuilder;
use datafusion::execution::context::SessionContext;
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion_flight_sql_server::service::FlightSqlService;
use tokio::sync::Semaphore;
use tonic::Request;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Identity, Server, ServerTlsConfig};

mod auth;
mod files;
mod policy;
mod service;

pub use auth::Credentials;
use auth::{Authenticator, random_token};
pub use files::{ConfinedFiles, ConfinedRegistry, DataRoots};
pub use policy::Access;
use service::SimjoinFlightService;
pub use service::{DEFAULT_MAX_CONCURRENT_QUERIES, QueryLimits};

/// Counters of the server's work, shared with whoever started it.
#[derive(Debug, Default)]
pub struct ServerStats {
    open_result_streams: AtomicUsize,
    result_streams: AtomicU64,
    refused_requests: AtomicU64,
}

impl ServerStats {
    /// Result streams (`DoGet`) the server is producing right now.
    pub fn open_result_streams(&self) -> usize {
        self.open_result_streams.load(Ordering::SeqCst)
    }

    /// Result streams started since the server started.
    pub fn result_streams(&self) -> u64 {
        self.result_streams.load(Ordering::SeqCst)
    }

    /// Requests refused for missing or wrong credentials.
    pub fn refused_requests(&self) -> u64 {
        self.refused_requests.load(Ordering::SeqCst)
    }
}

/// A Flight SQL server for a simjoin session.
///
/// ```no_run
/// # async fn example() -> datafusion::error::Result<()> {
/// let ctx = simjoin::session_context();
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:50051").await?;
/// simjoin::server::FlightSqlServer::new(&ctx)
///     .with_credentials(simjoin::server::Credentials::Token("secret".into()))
///     .serve(listener, async { tokio::signal::ctrl_c().await.ok(); })
///     .await
/// # }
/// ```
pub struct FlightSqlServer {
    ctx: SessionContext,
    credentials: Credentials,
    tls: Option<Identity>,
    access: Access,
    data_dirs: Vec<PathBuf>,
    limits: QueryLimits,
    stats: Arc<ServerStats>,
}

impl FlightSqlServer {
    /// Serves `ctx`'s tables, functions and options, read-only, with no file reachable but those
    /// of the tables registered on `ctx` before [`FlightSqlServer::serve`]; each request runs on a
    /// copy of its state, so a `SET` (with writes allowed) lasts for that request only (options
    /// travel in the functions' option strings).
    pub fn new(ctx: &SessionContext) -> Self {
        Self {
            ctx: ctx.clone(),
            credentials: Credentials::None,
            tls: None,
            access: Access::ReadOnly,
            data_dirs: Vec::new(),
            limits: QueryLimits::default(),
            stats: Arc::default(),
        }
    }

    pub fn with_credentials(mut self, credentials: Credentials) -> Self {
        self.credentials = credentials;
        self
    }

    /// Serves TLS with this PEM certificate chain and private key.
    pub fn with_tls(mut self, certificate_pem: impl AsRef<[u8]>, key_pem: impl AsRef<[u8]>) -> Self {
        self.tls = Some(Identity::from_pem(certificate_pem, key_pem));
        self
    }

    /// [`Access::ReadWrite`] lets clients run DDL, DML, `COPY` and `SET`: the tables one client
    /// creates or drops are those every client sees.
    pub fn with_access(mut self, access: Access) -> Self {
        self.access = access;
        self
    }

    /// A directory whose files queries may name (path arguments, `CREATE EXTERNAL TABLE`,
    /// `COPY … TO` with writes allowed); canonicalised when the server starts.
    pub fn with_data_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.data_dirs.push(dir.into());
        self
    }

    /// A time limit for each query (planning and result stream together).
    pub fn with_query_timeout(mut self, timeout: Duration) -> Self {
        self.limits.timeout = Some(timeout);
        self
    }

    /// The most queries that run at once; more are answered `RESOURCE_EXHAUSTED` ("busy").
    pub fn with_max_concurrent_queries(mut self, queries: usize) -> Self {
        self.limits.max_concurrent = queries.max(1);
        self
    }

    pub fn stats(&self) -> Arc<ServerStats> {
        self.stats.clone()
    }

    /// The roots of the file system a query may reach: the data directories, and the files and
    /// directories of the listing tables registered on the session.
    async fn data_roots(&self) -> Result<DataRoots> {
        let mut roots = DataRoots::default();
        for dir in &self.data_dirs {
            roots.add_data_dir(dir)?;
        }
        let catalogs = self.ctx.state().catalog_list().clone();
        for catalog in catalogs.catalog_names().iter().filter_map(|name| catalogs.catalog(name)) {
            for schema in catalog.schema_names().iter().filter_map(|name| catalog.schema(name)) {
                for table in schema.table_names() {
                    let Some(provider) = schema.table(&table).await? else { continue };
                    let Some(listing) = provider.downcast_ref::<ListingTable>() else { continue };
                    for url in listing.table_paths() {
                        if let Ok(path) = url.get_url().to_file_path() {
                            roots.add_table_path(&path)?;
                        }
                    }
                }
            }
        }
        Ok(roots)
    }

    /// Serves connections from `listener` until `shutdown` completes, then lets the requests in
    /// flight finish.
    pub async fn serve(self, listener: tokio::net::TcpListener, shutdown: impl Future<Output = ()>) -> Result<()> {
        // Every file a query names goes through the session's object store registry: the
        // served state's registry confines local files to the roots.
        let roots = self.data_roots().await?;
        let token = match &self.credentials {
            Credentials::None => None,
            Credentials::Token(token) => Some(token.clone()),
            // Handshakes hand out one random token per server process.
            Credentials::Password { .. } => Some(random_token()),
        };
        let authenticator = Arc::new(Authenticator { credentials: self.credentials, token, stats: self.stats.clone() });
        let state = self.ctx.state();
        // A server pays the GPU's start-up once, now, rather than leave `device=auto` to weigh it
        // against each of its first queries (and keep them all on the cores).
        #[cfg(feature = "gpu")]
        {
            let options = crate::options::SimJoinOptions::of(state.config_options());
            if options.device != crate::op::Device::Cpu && !options.cluster {
                crate::backend::start_gpu();
            }
        }
        let roots = Arc::new(roots);
        let registry = ConfinedRegistry::new(state.runtime_env().object_store_registry.clone(), roots.clone())?;
        let runtime =
            RuntimeEnvBuilder::from_runtime_env(state.runtime_env()).with_object_store_registry(Arc::new(registry));
        let mut state = SessionStateBuilder::new_from_existing(state).with_runtime_env(runtime.build_arc()?).build();
        // The rebuilt state registered its functions anew in no set order: DataFusion's own
        // `inner_product` (an alias of `array_dot_product`) could have replaced simjoin's.
        for function in crate::functions::scalar_functions() {
            datafusion::execution::FunctionRegistry::register_udf(&mut state, Arc::new(function))?;
        }
        let service = SimjoinFlightService {
            inner: FlightSqlService::new(state.clone()).with_sql_options(self.access.sql_options()),
            state,
            access: self.access,
            roots,
            limits: self.limits,
            running: Arc::new(Semaphore::new(self.limits.max_concurrent)),
            authenticator: authenticator.clone(),
            stats: self.stats,
        };
        let check = move |request: Request<()>| authenticator.check(request);
        let mut builder = Server::builder();
        if let Some(identity) = self.tls {
            builder = builder.tls_config(ServerTlsConfig::new().identity(identity)).map_err(|e| {
                DataFusionError::Configuration(format!("simjoin serve: invalid TLS certificate or key: {e}"))
            })?;
        }
        let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
        builder
            .add_service(FlightServiceServer::with_interceptor(service, check))
            .serve_with_incoming_shutdown(incoming, shutdown)
            .await
            .map_err(|e| DataFusionError::External(Box::new(e)))
    }
}
