//! Arrow Flight SQL server: a simjoin session served with the maintained
//! [`datafusion_flight_sql_server`] service (statements, prepared statements with parameters,
//! catalog metadata), behind tonic's TLS and an authentication check.
//!
//! The crate's service answers every Flight SQL call but refuses the `Handshake`, which is how
//! clients with a user name and password (ADBC, JDBC, `FlightSqlServiceClient::handshake`) obtain
//! a bearer token. [`SimjoinFlightService`] wraps it: it answers the handshake itself, delegates
//! every other call, and counts the result streams that are open, so that a client which
//! disconnects can be seen to stop the work (dropping the response stream drops the DataFusion
//! stream, and [`crate::SimilarityExec`] stops its backend when its stream is dropped).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use arrow_flight::flight_service_server::{FlightService, FlightServiceServer};
use arrow_flight::sql::{Any, Command, CommandGetDbSchemas, CommandGetTables, ProstMessageExt as _};
use arrow_flight::{
    Action, Criteria, Empty, FlightData, FlightDescriptor, FlightInfo, HandshakeRequest, HandshakeResponse, PollInfo,
    SchemaResult, Ticket,
};
use base64::Engine as _;
use base64::alphabet;
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::context::SessionContext;
use datafusion_flight_sql_server::service::FlightSqlService;
use futures::{Stream, StreamExt};
use prost::Message as _;
use tonic::metadata::MetadataValue;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Identity, Server, ServerTlsConfig};
use tonic::{Request, Response, Status, Streaming};

/// Who may use the server.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum Credentials {
    /// Anyone who can reach the socket.
    #[default]
    None,
    /// Clients send `authorization: Bearer <token>`.
    Token(String),
    /// Clients authenticate with HTTP Basic credentials (on the Flight `Handshake`, which answers
    /// with a bearer token for the following calls, or on every call).
    Password { user: String, password: String },
}

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
    stats: Arc<ServerStats>,
}

impl FlightSqlServer {
    /// Serves `ctx`'s tables, functions and options; each request runs on a copy of its state, so
    /// a `SET` lasts for that request only (options travel in the functions' option strings).
    pub fn new(ctx: &SessionContext) -> Self {
        Self { ctx: ctx.clone(), credentials: Credentials::None, tls: None, stats: Arc::default() }
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

    pub fn stats(&self) -> Arc<ServerStats> {
        self.stats.clone()
    }

    /// Serves connections from `listener` until `shutdown` completes, then lets the requests in
    /// flight finish.
    pub async fn serve(self, listener: tokio::net::TcpListener, shutdown: impl Future<Output = ()>) -> Result<()> {
        let token = match &self.credentials {
            Credentials::None => None,
            Credentials::Token(token) => Some(token.clone()),
            // Handshakes hand out one random token per server process.
            Credentials::Password { .. } => Some(random_token()),
        };
        let authenticator = Arc::new(Authenticator { credentials: self.credentials, token, stats: self.stats.clone() });
        let state = self.ctx.state();
        let service = SimjoinFlightService {
            default_catalog: state.config_options().catalog.default_catalog.clone(),
            inner: FlightSqlService::new(state),
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

fn random_token() -> String {
    let bytes: [u8; 24] = rand::random();
    BASE64.encode(bytes)
}

struct Authenticator {
    credentials: Credentials,
    /// The bearer token that is accepted (none when the server is open).
    token: Option<String>,
    stats: Arc<ServerStats>,
}

impl Authenticator {
    /// Lets a request through when the server is open, or when it carries the bearer token, or
    /// (with user and password configured) valid Basic credentials.
    fn check(&self, request: Request<()>) -> std::result::Result<Request<()>, Status> {
        let Some(token) = &self.token else { return Ok(request) };
        let header = request.metadata().get("authorization").and_then(|v| v.to_str().ok());
        let accepted = match header {
            Some(value) => match value.split_once(' ') {
                Some((scheme, presented)) if scheme.eq_ignore_ascii_case("bearer") => {
                    constant_time_eq(presented.as_bytes(), token.as_bytes())
                }
                Some((scheme, presented)) if scheme.eq_ignore_ascii_case("basic") => self.basic_is_valid(presented),
                _ => false,
            },
            None => false,
        };
        if accepted {
            Ok(request)
        } else {
            self.stats.refused_requests.fetch_add(1, Ordering::SeqCst);
            let reason = if header.is_none() { "no credentials given" } else { "invalid credentials" };
            Err(Status::unauthenticated(format!("simjoin server: {reason}")))
        }
    }

    fn basic_is_valid(&self, encoded: &str) -> bool {
        let Credentials::Password { user, password } = &self.credentials else { return false };
        // Go's Flight client (ADBC) sends the credentials unpadded; Rust's and Java's padded.
        let lenient = GeneralPurpose::new(
            &alphabet::STANDARD,
            GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
        );
        let Ok(decoded) = lenient.decode(encoded.trim()) else { return false };
        let Some((given_user, given_password)) = std::str::from_utf8(&decoded).ok().and_then(|s| s.split_once(':'))
        else {
            return false;
        };
        // Both compared in full, so the time taken does not tell which one was wrong.
        constant_time_eq(given_user.as_bytes(), user.as_bytes())
            & constant_time_eq(given_password.as_bytes(), password.as_bytes())
    }
}

/// Equality whose time depends on the lengths only, not on where the first difference is.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The crate's Flight SQL service plus the handshake and the result-stream accounting.
struct SimjoinFlightService {
    inner: FlightSqlService,
    default_catalog: String,
    authenticator: Arc<Authenticator>,
    stats: Arc<ServerStats>,
}

type BoxedStream<T> = Pin<Box<dyn Stream<Item = std::result::Result<T, Status>> + Send + 'static>>;

/// Decrements the open-stream count when the response stream is dropped: finished, failed, or
/// abandoned by a client that went away.
struct OpenStream(Arc<ServerStats>);

impl OpenStream {
    fn new(stats: Arc<ServerStats>) -> Self {
        stats.open_result_streams.fetch_add(1, Ordering::SeqCst);
        stats.result_streams.fetch_add(1, Ordering::SeqCst);
        Self(stats)
    }
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.0.open_result_streams.fetch_sub(1, Ordering::SeqCst);
    }
}

#[tonic::async_trait]
impl FlightService for SimjoinFlightService {
    type HandshakeStream = BoxedStream<HandshakeResponse>;
    type ListFlightsStream = <FlightSqlService as FlightService>::ListFlightsStream;
    type DoGetStream = BoxedStream<FlightData>;
    type DoPutStream = <FlightSqlService as FlightService>::DoPutStream;
    type DoExchangeStream = <FlightSqlService as FlightService>::DoExchangeStream;
    type DoActionStream = <FlightSqlService as FlightService>::DoActionStream;
    type ListActionsStream = <FlightSqlService as FlightService>::ListActionsStream;

    /// The interceptor has already checked the credentials; the answer carries the bearer token
    /// for the calls that follow (`authorization` header, as Flight clients expect).
    async fn handshake(
        &self,
        _request: Request<Streaming<HandshakeRequest>>,
    ) -> std::result::Result<Response<Self::HandshakeStream>, Status> {
        let payload = self.authenticator.token.clone().unwrap_or_default();
        let mut response: Response<Self::HandshakeStream> =
            Response::new(Box::pin(futures::stream::once(async move {
                Ok(HandshakeResponse { protocol_version: 0, payload: payload.into_bytes().into() })
            })));
        if let Some(token) = &self.authenticator.token {
            let value = MetadataValue::try_from(format!("Bearer {token}"))
                .map_err(|_| Status::internal("simjoin server: the bearer token is not a valid header value"))?;
            response.metadata_mut().insert("authorization", value);
        }
        Ok(response)
    }

    async fn do_get(&self, mut request: Request<Ticket>) -> std::result::Result<Response<Self::DoGetStream>, Status> {
        // The crate lists schemas and tables only of the catalog a GetDbSchemas / GetTables
        // names; clients that name none (ADBC's get_objects, `get_tables` with `catalog: None`)
        // get the session's default catalog, where `--table` and `register_*` put tables.
        let command = Any::decode(request.get_ref().ticket.clone()).ok().and_then(|any| Command::try_from(any).ok());
        let default_catalog = Some(self.default_catalog.clone());
        let rewritten = match command {
            Some(Command::CommandGetTables(query)) if query.catalog.is_none() => {
                Some(CommandGetTables { catalog: default_catalog, ..query }.as_any())
            }
            Some(Command::CommandGetDbSchemas(query)) if query.catalog.is_none() => {
                Some(CommandGetDbSchemas { catalog: default_catalog, ..query }.as_any())
            }
            _ => None,
        };
        if let Some(any) = rewritten {
            request.get_mut().ticket = any.encode_to_vec().into();
        }
        let open = OpenStream::new(self.stats.clone());
        let response = self.inner.do_get(request).await?;
        Ok(response.map(|stream| {
            Box::pin(stream.map(move |item| {
                let _open = &open;
                item
            })) as Self::DoGetStream
        }))
    }

    async fn list_flights(
        &self,
        request: Request<Criteria>,
    ) -> std::result::Result<Response<Self::ListFlightsStream>, Status> {
        self.inner.list_flights(request).await
    }

    async fn get_flight_info(
        &self,
        request: Request<FlightDescriptor>,
    ) -> std::result::Result<Response<FlightInfo>, Status> {
        self.inner.get_flight_info(request).await
    }

    async fn poll_flight_info(
        &self,
        request: Request<FlightDescriptor>,
    ) -> std::result::Result<Response<PollInfo>, Status> {
        self.inner.poll_flight_info(request).await
    }

    async fn get_schema(
        &self,
        request: Request<FlightDescriptor>,
    ) -> std::result::Result<Response<SchemaResult>, Status> {
        self.inner.get_schema(request).await
    }

    async fn do_put(
        &self,
        request: Request<Streaming<FlightData>>,
    ) -> std::result::Result<Response<Self::DoPutStream>, Status> {
        self.inner.do_put(request).await
    }

    async fn do_exchange(
        &self,
        request: Request<Streaming<FlightData>>,
    ) -> std::result::Result<Response<Self::DoExchangeStream>, Status> {
        self.inner.do_exchange(request).await
    }

    async fn do_action(&self, request: Request<Action>) -> std::result::Result<Response<Self::DoActionStream>, Status> {
        self.inner.do_action(request).await
    }

    async fn list_actions(
        &self,
        request: Request<Empty>,
    ) -> std::result::Result<Response<Self::ListActionsStream>, Status> {
        self.inner.list_actions(request).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn authenticator(credentials: Credentials, token: Option<&str>) -> Authenticator {
        Authenticator { credentials, token: token.map(str::to_string), stats: Arc::default() }
    }

    fn request(authorization: Option<&str>) -> Request<()> {
        let mut request = Request::new(());
        if let Some(value) = authorization {
            request.metadata_mut().insert("authorization", value.parse().unwrap());
        }
        request
    }

    #[test]
    fn an_open_server_lets_everyone_in() {
        let open = authenticator(Credentials::None, None);
        assert!(open.check(request(None)).is_ok());
        assert!(open.check(request(Some("Bearer anything"))).is_ok());
    }

    #[test]
    fn tokens_and_passwords_are_checked() {
        let token = authenticator(Credentials::Token("s3cret".into()), Some("s3cret"));
        assert!(token.check(request(Some("Bearer s3cret"))).is_ok());
        assert!(token.check(request(Some("bearer s3cret"))).is_ok());
        for refused in [None, Some("Bearer s3cre"), Some("Bearer s3cret!"), Some("s3cret"), Some("Basic czNjcmV0")] {
            let status = token.check(request(refused)).unwrap_err();
            assert_eq!(status.code(), tonic::Code::Unauthenticated, "{refused:?}");
        }
        assert_eq!(token.stats.refused_requests(), 5);

        let password =
            authenticator(Credentials::Password { user: "ann".into(), password: "pw:1".into() }, Some("tok"));
        let basic = |s: &str| format!("Basic {}", BASE64.encode(s));
        assert!(password.check(request(Some(&basic("ann:pw:1")))).is_ok());
        assert!(
            password.check(request(Some(basic("ann:pw:1").trim_end_matches('=')))).is_ok(),
            "unpadded, as Go sends it"
        );
        assert!(password.check(request(Some("Bearer tok"))).is_ok());
        for refused in [basic("ann:pw"), basic("bob:pw:1"), basic("annpw:1"), "Basic !!!".to_string()] {
            assert!(password.check(request(Some(&refused))).is_err(), "{refused}");
        }
    }
}
