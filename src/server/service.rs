//! The Flight service: the crate's [`FlightSqlService`] wrapped with what it lacks — the
//! handshake, the read-only check of every statement and Substrait plan ([`Access`]), per-query
//! limits (a time limit and a cap on concurrent result streams), and the accounting of open
//! result streams, so that a client which disconnects can be seen to stop the work (dropping the
//! response stream drops the DataFusion stream, and [`crate::SimilarityExec`] stops its backend
//! when its stream is dropped).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use std::time::Duration;

use arrow_flight::flight_service_server::FlightService;
use arrow_flight::sql::{
    ActionCreatePreparedStatementRequest, Any, Command, CommandGetDbSchemas, CommandGetTables,
    CommandStatementSubstraitPlan, ProstMessageExt as _,
};
use arrow_flight::{
    Action, Criteria, Empty, FlightData, FlightDescriptor, FlightInfo, HandshakeRequest, HandshakeResponse, PollInfo,
    SchemaResult, Ticket,
};
use datafusion::execution::context::SessionState;
use datafusion_flight_sql_server::service::FlightSqlService;
use futures::{Stream, StreamExt};
use prost::Message as _;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};
use tonic::metadata::MetadataValue;
use tonic::{Request, Response, Status, Streaming};

use super::ServerStats;
use super::auth::Authenticator;
use super::files::DataRoots;
use super::policy::Access;

/// Limits on each query, besides the session's shared memory pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueryLimits {
    /// A query (planning and its result stream) still running after this is cancelled.
    pub timeout: Option<Duration>,
    /// Result streams open at once; a query beyond them is answered "busy" at once.
    pub max_concurrent: usize,
}

impl Default for QueryLimits {
    fn default() -> Self {
        Self { timeout: None, max_concurrent: DEFAULT_MAX_CONCURRENT_QUERIES }
    }
}

/// The default cap on concurrent queries.
pub const DEFAULT_MAX_CONCURRENT_QUERIES: usize = 64;

pub(super) struct SimjoinFlightService {
    pub(super) inner: FlightSqlService,
    /// The served session's state: statements are parsed, and Substrait plans decoded, against it.
    pub(super) state: SessionState,
    pub(super) access: Access,
    /// The roots the confined file store allows, for the up-front check of a statement's paths.
    pub(super) roots: Arc<DataRoots>,
    pub(super) limits: QueryLimits,
    pub(super) running: Arc<Semaphore>,
    pub(super) authenticator: Arc<Authenticator>,
    pub(super) stats: Arc<ServerStats>,
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

/// A result stream under the query's limits: it holds its slot among the concurrent queries and
/// its open-stream count until dropped, and past its deadline it drops the query's stream (which
/// stops the work and returns its memory) and ends with `DEADLINE_EXCEEDED`.
struct LimitedStream {
    inner: Option<BoxedStream<FlightData>>,
    deadline: Option<(Pin<Box<Sleep>>, Duration)>,
    _slot: OwnedSemaphorePermit,
    _open: OpenStream,
}

impl Stream for LimitedStream {
    type Item = Result<FlightData, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let Some(inner) = self.inner.as_mut() else { return Poll::Ready(None) };
        if let Poll::Ready(item) = inner.as_mut().poll_next(cx) {
            return Poll::Ready(item);
        }
        if let Some((sleep, timeout)) = self.deadline.as_mut()
            && sleep.as_mut().poll(cx).is_ready()
        {
            let timeout = *timeout;
            self.inner = None;
            return Poll::Ready(Some(Err(timed_out(timeout))));
        }
        Poll::Pending
    }
}

fn timed_out(timeout: Duration) -> Status {
    Status::deadline_exceeded(format!(
        "simjoin server: the query ran longer than the server's query timeout ({timeout:?}) and was cancelled"
    ))
}

/// The Flight SQL command a ticket carries: catalog calls carry the command itself, queries the
/// crate's ticket message, whose field 2 holds the command (so it decodes as an `Any`'s value).
fn ticket_command(ticket: &[u8]) -> Option<Command> {
    let any = Any::decode(ticket).ok()?;
    match Command::try_from(any.clone()).ok()? {
        Command::Unknown(_) => Command::try_from(Any::decode(any.value).ok()?).ok(),
        command => Some(command),
    }
}

impl SimjoinFlightService {
    /// Checks the command a descriptor carries (statements, prepared statements, Substrait plans).
    async fn check_descriptor(&self, descriptor: &FlightDescriptor) -> Result<(), Status> {
        match Any::decode(descriptor.cmd.clone()).ok().and_then(|any| Command::try_from(any).ok()) {
            Some(command) => self.check(&command).await,
            None => Ok(()),
        }
    }

    /// Refuses a command that would write when the server is read-only.
    async fn check(&self, command: &Command) -> Result<(), Status> {
        match command {
            Command::CommandStatementQuery(query) => self.access.check_sql(&self.state, &self.roots, &query.query),
            Command::CommandStatementUpdate(update) => self.access.check_sql(&self.state, &self.roots, &update.query),
            Command::CommandStatementSubstraitPlan(CommandStatementSubstraitPlan { plan: Some(plan), .. })
                if self.access == Access::ReadOnly =>
            {
                // A plan that does not decode is left to the crate's service, which reports it.
                let Ok(decoded) = datafusion_substrait::serializer::deserialize_bytes(&plan.plan) else {
                    return Ok(());
                };
                match datafusion_substrait::logical_plan::consumer::from_substrait_plan(&self.state, &decoded).await {
                    Ok(logical) => self.access.check_plan(&logical),
                    Err(_) => Ok(()),
                }
            }
            _ => Ok(()),
        }
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
        let start = Instant::now();
        let command = ticket_command(&request.get_ref().ticket);
        if let Some(command) = &command {
            self.check(command).await?;
        }
        // The crate lists schemas and tables only of the catalog a GetDbSchemas / GetTables
        // names; clients that name none (ADBC's get_objects, `get_tables` with `catalog: None`)
        // get the session's default catalog, where `--table` and `register_*` put tables.
        let default_catalog = Some(self.state.config_options().catalog.default_catalog.clone());
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
        let slot = self.running.clone().try_acquire_owned().map_err(|_| {
            Status::resource_exhausted(format!(
                "simjoin server: busy: {} queries are running, the most this server runs at once; try again later",
                self.limits.max_concurrent
            ))
        })?;
        let open = OpenStream::new(self.stats.clone());
        let response = match self.limits.timeout {
            Some(timeout) => tokio::time::timeout_at(start + timeout, self.inner.do_get(request))
                .await
                .map_err(|_| timed_out(timeout))??,
            None => self.inner.do_get(request).await?,
        };
        let deadline = self.limits.timeout.map(|t| (Box::pin(tokio::time::sleep_until(start + t)), t));
        Ok(response.map(|stream| {
            Box::pin(LimitedStream { inner: Some(stream.boxed()), deadline, _slot: slot, _open: open })
                as Self::DoGetStream
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
        self.check_descriptor(request.get_ref()).await?;
        self.inner.get_flight_info(request).await
    }

    async fn poll_flight_info(
        &self,
        request: Request<FlightDescriptor>,
    ) -> std::result::Result<Response<PollInfo>, Status> {
        self.check_descriptor(request.get_ref()).await?;
        self.inner.poll_flight_info(request).await
    }

    async fn get_schema(
        &self,
        request: Request<FlightDescriptor>,
    ) -> std::result::Result<Response<SchemaResult>, Status> {
        self.check_descriptor(request.get_ref()).await?;
        self.inner.get_schema(request).await
    }

    /// The crate's `DoPut` binds prepared-statement parameters and refuses updates and ingestion;
    /// any SQL it plans passes its [`Access::sql_options`] check.
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
        let action = request.get_ref();
        if action.r#type == "CreatePreparedStatement"
            && let Ok(Some(prepare)) = Any::decode(action.body.clone())
                .map(|any| any.unpack::<ActionCreatePreparedStatementRequest>().ok().flatten())
        {
            self.access.check_sql(&self.state, &self.roots, &prepare.query)?;
        }
        self.inner.do_action(request).await
    }

    async fn list_actions(
        &self,
        request: Request<Empty>,
    ) -> std::result::Result<Response<Self::ListActionsStream>, Status> {
        self.inner.list_actions(request).await
    }
}
