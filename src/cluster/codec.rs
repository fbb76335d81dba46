//! How a plan with simjoin's table and operator crosses the wire between the client, the
//! scheduler and the executors of a Ballista cluster. Ballista ships the client's logical plan
//! (table functions already expanded into a [`SimilarityTable`]) to the scheduler, which plans it
//! physically and ships each task's part ([`SimilarityExec`] included) to an executor. Each codec
//! handles simjoin's nodes and hands every other node to Ballista's own codec.
//!
//! A node is encoded as a tag naming it, then JSON: the operation with every option, the output
//! columns and the vector source of each side. A table's inputs travel as logical plans (a
//! path's table as its listing, so the executors read the files themselves; a view as its plan)
//! and an operator's output schema as DataFusion's protobuf. The backend never travels: the
//! scheduler plans with a stand-in ([`backend::on_executor`]) and each executor chooses its own
//! when it decodes its part, with the executor's device where the query left `device=auto`.

use std::sync::Arc;

use ballista_core::serde::{BallistaLogicalExtensionCodec, BallistaPhysicalExtensionCodec};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::{Schema, SchemaRef};
use datafusion::arrow::ipc::reader::StreamReader;
use datafusion::arrow::ipc::writer::StreamWriter;
use datafusion::catalog::view::ViewTable;
use datafusion::catalog::{MemTable, TableProvider};
use datafusion::common::{DataFusionError, Result, TableReference, internal_err, plan_err};
use datafusion::datasource::file_format::FileFormatFactory;
use datafusion::datasource::{provider_as_source, source_as_provider};
use datafusion::execution::TaskContext;
use datafusion::logical_expr::{Extension, LogicalPlan, LogicalPlanBuilder};
use datafusion::physical_plan::ExecutionPlan;
use datafusion_proto::logical_plan::{AsLogicalPlan, LogicalExtensionCodec};
use datafusion_proto::physical_plan::{PhysicalExtensionCodec, PhysicalProtoConverterExtension};
use datafusion_proto::protobuf::LogicalPlanNode;
use prost::Message;
use serde::{Deserialize, Serialize};

use crate::backend;
use crate::exec::{InputSide, KnnMergeExec, SimilarityExec, SimilarityExecBuilder, WholeInputExec};
use crate::op::{Device, SimilarityOp};
use crate::results::{OutputColumn, SummaryColumn};
use crate::table::{SimilarityTable, TableInput};
use crate::vectors::VectorSource;

/// The first bytes of an encoded [`SimilarityTable`].
const TABLE_TAG: &[u8] = b"simjoin.table.1:";
/// The first bytes of an encoded [`SimilarityExec`].
const EXEC_TAG: &[u8] = b"simjoin.exec.1:";
/// The whole of an encoded [`WholeInputExec`] (its input is encoded as its child).
const WHOLE_TAG: &[u8] = b"simjoin.whole.1";
/// The first bytes of an encoded [`KnnMergeExec`] (its input is encoded as its child).
const MERGE_TAG: &[u8] = b"simjoin.knn_merge.1:";

#[derive(Serialize, Deserialize)]
struct MergeMessage {
    k: usize,
    rank: Option<usize>,
}

#[derive(Serialize, Deserialize)]
struct TableMessage {
    op: SimilarityOp,
    left: InputMessage,
    right: Option<InputMessage>,
}

#[derive(Serialize, Deserialize)]
struct InputMessage {
    data: InputData,
    source: VectorSource,
    describe: String,
}

/// Where an input's rows come from on the other side.
#[derive(Serialize, Deserialize)]
enum InputData {
    /// A scan of the input's table, as a protobuf `LogicalPlanNode` in base64: the executors
    /// read the files (or run the view's plan) themselves.
    Scan(String),
    /// An in-memory table's rows (a literal query vector or string list, a table the client
    /// registered from batches), as an Arrow IPC stream in base64, one stream per partition.
    Rows(Vec<String>),
}

#[derive(Serialize, Deserialize)]
struct ExecMessage {
    op: SimilarityOp,
    left: InputSide,
    right: InputSide,
    columns: Vec<OutputColumn>,
    /// The output schema as a protobuf `Schema` in base64.
    schema: String,
    tasks: Option<usize>,
    /// The summary row's columns, where the operator computes an aggregate (exec/summary.rs).
    summary: Vec<SummaryColumn>,
}

fn to_json<T: Serialize>(tag: &[u8], value: &T, buf: &mut Vec<u8>) -> Result<()> {
    buf.extend_from_slice(tag);
    serde_json::to_writer(buf, value).map_err(|e| DataFusionError::Internal(format!("encoding a simjoin node: {e}")))
}

fn from_json<'a, T: Deserialize<'a>>(tag: &[u8], buf: &'a [u8]) -> Result<T> {
    serde_json::from_slice(&buf[tag.len()..]).map_err(|e| {
        DataFusionError::Internal(format!(
            "decoding a simjoin node: {e} (are the client, scheduler and executors the same simjoin version?)"
        ))
    })
}

fn from_base64(text: &str) -> Result<Vec<u8>> {
    BASE64.decode(text).map_err(|e| DataFusionError::Internal(format!("decoding a simjoin node: {e}")))
}

/// The logical codec: [`SimilarityTable`]s, and through Ballista's codec everything else.
#[derive(Debug, Default)]
pub struct LogicalCodec {
    ballista: BallistaLogicalExtensionCodec,
}

impl LogicalCodec {
    fn encode_input(&self, table_ref: &TableReference, input: &TableInput) -> Result<InputMessage> {
        let (source, describe) = (input.source.clone(), input.describe.clone());
        if let Some(table) = input.provider.downcast_ref::<MemTable>() {
            let partitions = table.batches.iter().map(|partition| match partition.try_read() {
                Ok(batches) => ipc_stream(&table.schema(), &batches),
                Err(_) => plan_err!("{}: the in-memory table is being written to", input.describe),
            });
            let data = InputData::Rows(partitions.collect::<Result<_>>()?);
            return Ok(InputMessage { data, source, describe });
        }
        let scan =
            LogicalPlanBuilder::scan(table_ref.clone(), provider_as_source(input.provider.clone()), None)?.build()?;
        let node = LogicalPlanNode::try_from_logical_plan(&scan, self).map_err(|e| {
            DataFusionError::Plan(format!(
                "{}: this input cannot be sent to a cluster (a table registered from a file path, a directory or an object-store URL can; an in-memory table cannot): {e}",
                input.describe
            ))
        })?;
        Ok(InputMessage { data: InputData::Scan(BASE64.encode(node.encode_to_vec())), source, describe })
    }

    fn decode_input(&self, message: InputMessage, ctx: &TaskContext) -> Result<TableInput> {
        let (source, describe) = (message.source, message.describe);
        let scan = match message.data {
            InputData::Scan(scan) => scan,
            InputData::Rows(partitions) => {
                let mut schema = None;
                let mut batches = Vec::new();
                for partition in partitions {
                    let reader = StreamReader::try_new(std::io::Cursor::new(from_base64(&partition)?), None)?;
                    schema = Some(reader.schema());
                    batches.push(reader.collect::<std::result::Result<Vec<_>, _>>()?);
                }
                let Some(schema) = schema else { return internal_err!("decoding a simjoin input: no rows") };
                let provider = Arc::new(MemTable::try_new(schema, batches)?);
                return Ok(TableInput { provider, source, describe });
            }
        };
        let bytes = from_base64(&scan)?;
        let node = LogicalPlanNode::decode(bytes.as_slice())
            .map_err(|e| DataFusionError::Internal(format!("decoding a simjoin input: {e}")))?;
        // A table's scan comes back as one; a view's as the view's plan, kept as a view.
        let provider = match node.try_into_logical_plan(ctx, self)? {
            LogicalPlan::TableScan(scan) => source_as_provider(&scan.source)?,
            plan => Arc::new(ViewTable::new(plan, None)),
        };
        Ok(TableInput { provider, source, describe })
    }
}

/// `batches` as an Arrow IPC stream in base64.
fn ipc_stream(schema: &SchemaRef, batches: &[RecordBatch]) -> Result<String> {
    let mut writer = StreamWriter::try_new(Vec::new(), schema)?;
    for batch in batches {
        writer.write(batch)?;
    }
    Ok(BASE64.encode(writer.into_inner()?))
}

impl LogicalExtensionCodec for LogicalCodec {
    fn try_decode(&self, buf: &[u8], inputs: &[LogicalPlan], ctx: &TaskContext) -> Result<Extension> {
        self.ballista.try_decode(buf, inputs, ctx)
    }

    fn try_encode(&self, node: &Extension, buf: &mut Vec<u8>) -> Result<()> {
        self.ballista.try_encode(node, buf)
    }

    fn try_decode_table_provider(
        &self,
        buf: &[u8],
        table_ref: &TableReference,
        schema: SchemaRef,
        ctx: &TaskContext,
    ) -> Result<Arc<dyn TableProvider>> {
        if !buf.starts_with(TABLE_TAG) {
            return self.ballista.try_decode_table_provider(buf, table_ref, schema, ctx);
        }
        let message: TableMessage = from_json(TABLE_TAG, buf)?;
        let left = self.decode_input(message.left, ctx)?;
        let right = message.right.map(|r| self.decode_input(r, ctx)).transpose()?;
        let backend = backend::on_executor();
        let table = SimilarityTable::new(message.op, left, right, backend).on_cluster();
        if table.schema().fields() != schema.fields() {
            return internal_err!("decoding a simjoin table: its schema differs from the plan's");
        }
        Ok(Arc::new(table))
    }

    fn try_encode_table_provider(
        &self,
        table_ref: &TableReference,
        node: Arc<dyn TableProvider>,
        buf: &mut Vec<u8>,
    ) -> Result<()> {
        let Some(table) = node.downcast_ref::<SimilarityTable>() else {
            return self.ballista.try_encode_table_provider(table_ref, node, buf);
        };
        let (left, right) = table.inputs();
        let message = TableMessage {
            op: table.op().clone(),
            left: self.encode_input(table_ref, left)?,
            right: right.map(|r| self.encode_input(table_ref, r)).transpose()?,
        };
        to_json(TABLE_TAG, &message, buf)
    }

    fn try_decode_file_format(&self, buf: &[u8], ctx: &TaskContext) -> Result<Arc<dyn FileFormatFactory>> {
        self.ballista.try_decode_file_format(buf, ctx)
    }

    fn try_encode_file_format(&self, buf: &mut Vec<u8>, node: Arc<dyn FileFormatFactory>) -> Result<()> {
        self.ballista.try_encode_file_format(buf, node)
    }
}

/// Where a physical codec decodes operators: a planner keeps the stand-in backend, an executor
/// chooses the one that computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The client or the scheduler.
    Planner,
    /// An executor; `device` replaces `device=auto` (`simjoin executor --device`).
    Executor { device: Device },
}

/// The physical codec: [`SimilarityExec`], and through Ballista's codec everything else.
#[derive(Debug)]
pub struct PhysicalCodec {
    ballista: BallistaPhysicalExtensionCodec,
    role: Role,
}

impl PhysicalCodec {
    /// The codec of a process in `role`.
    pub fn new(role: Role) -> Self {
        Self { ballista: BallistaPhysicalExtensionCodec::default(), role }
    }
}

impl PhysicalExtensionCodec for PhysicalCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[Arc<dyn ExecutionPlan>],
        ctx: &TaskContext,
        proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if buf == WHOLE_TAG {
            return match inputs {
                [input] => Ok(Arc::new(WholeInputExec::new(input.clone()))),
                _ => internal_err!("decoding a simjoin WholeInputExec: {} inputs", inputs.len()),
            };
        }
        if buf.starts_with(MERGE_TAG) {
            let message: MergeMessage = from_json(MERGE_TAG, buf)?;
            return match inputs {
                [input] => Ok(Arc::new(KnnMergeExec::try_new(input.clone(), message.k, message.rank)?)),
                _ => internal_err!("decoding a simjoin KnnMergeExec: {} inputs", inputs.len()),
            };
        }
        if !buf.starts_with(EXEC_TAG) {
            return self.ballista.try_decode(buf, inputs, ctx, proto_converter);
        }
        let message: ExecMessage = from_json(EXEC_TAG, buf)?;
        let schema_bytes = from_base64(&message.schema)?;
        let schema = datafusion_proto::protobuf::Schema::decode(schema_bytes.as_slice())
            .map_err(|e| DataFusionError::Internal(format!("decoding a simjoin operator's schema: {e}")))?;
        let schema = Arc::new(Schema::try_from(&schema)?);
        let mut op = message.op;
        let backend = match self.role {
            Role::Planner => backend::on_executor(),
            Role::Executor { device } => {
                // The executor's device where the query left the choice open; GPUs the query
                // named matter only where it runs on GPUs.
                if op.device == Device::Auto {
                    op.device = device;
                    if device == Device::Cpu {
                        op.devices = crate::op::Devices::All;
                    }
                }
                // Sizes unknown here: a GPU starts opening at once, as the scans begin.
                let chosen = backend::choose(&op)?;
                chosen.for_inputs(&op, &backend::KnownSizes::default()).unwrap_or(chosen)
            }
        };
        let exec = SimilarityExecBuilder::new(Arc::new(op), backend)
            .inputs(inputs.to_vec(), message.left, message.right)
            .tasks(message.tasks);
        let exec = match message.summary.as_slice() {
            [] => exec.output(message.columns, schema),
            _ => exec.summary(message.summary, schema),
        };
        Ok(Arc::new(exec.build()?))
    }

    fn try_encode(
        &self,
        node: Arc<dyn ExecutionPlan>,
        buf: &mut Vec<u8>,
        proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<()> {
        if node.downcast_ref::<WholeInputExec>().is_some() {
            buf.extend_from_slice(WHOLE_TAG);
            return Ok(());
        }
        if let Some(merge) = node.downcast_ref::<KnnMergeExec>() {
            return to_json(MERGE_TAG, &MergeMessage { k: merge.k(), rank: merge.rank() }, buf);
        }
        let Some(exec) = node.downcast_ref::<SimilarityExec>() else {
            return self.ballista.try_encode(node, buf, proto_converter);
        };
        let (left, right) = exec.sides();
        let schema = datafusion_proto::protobuf::Schema::try_from(exec.schema().as_ref())?;
        let message = ExecMessage {
            op: exec.op().clone(),
            left: left.clone(),
            right: right.clone(),
            columns: exec.columns().to_vec(),
            schema: BASE64.encode(schema.encode_to_vec()),
            tasks: exec.tasks(),
            summary: exec.summary().to_vec(),
        };
        to_json(EXEC_TAG, &message, buf)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::catalog::TableProvider;
    use datafusion::common::TableReference;
    use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
    use datafusion::datasource::source_as_provider;
    use datafusion::logical_expr::LogicalPlan;
    use datafusion::physical_plan::ExecutionPlan;
    use datafusion_proto::logical_plan::LogicalExtensionCodec;
    use datafusion_proto::physical_plan::PhysicalExtensionCodec;

    use crate::cluster::{LogicalCodec, PhysicalCodec, Role};
    use crate::exec::{KnnMergeExec, SimilarityExec, WholeInputExec};
    use crate::op::{Device, SimilarityOp};
    use crate::table::SimilarityTable;

    /// The table of the one table-function call in `sql`.
    async fn table_of(ctx: &datafusion::prelude::SessionContext, sql: &str) -> Arc<dyn TableProvider> {
        let plan = ctx.sql(sql).await.unwrap().into_unoptimized_plan();
        let mut found = None;
        plan.apply(|node| {
            if let LogicalPlan::TableScan(scan) = node {
                found = Some(source_as_provider(&scan.source).unwrap());
            }
            Ok(TreeNodeRecursion::Continue)
        })
        .unwrap();
        found.expect("a table scan")
    }

    #[tokio::test]
    async fn tables_and_operators_survive_a_round_trip_through_bytes() {
        let ctx = crate::session_context();
        ctx.sql("CREATE TABLE points AS VALUES (1, [1.0, 2.0]), (2, [3.0, 4.5]), (3, [0.0, 1.0])").await.unwrap();
        let sql = "SELECT * FROM knn(points, '[0.5, 0.25]', 2, \
                   'metric=l1, device=auto, gpu_memory_limit=1G, devices=0,1, cache_size=0')";
        let table = table_of(&ctx, sql).await;
        let codec = LogicalCodec::default();
        let table_ref = TableReference::bare("knn()");
        let mut bytes = Vec::new();
        codec.try_encode_table_provider(&table_ref, table.clone(), &mut bytes).unwrap();
        let task = ctx.task_ctx();
        let decoded = codec.try_decode_table_provider(&bytes, &table_ref, table.schema(), &task).unwrap();
        let (before, after) =
            (table.downcast_ref::<SimilarityTable>().unwrap(), decoded.downcast_ref::<SimilarityTable>().unwrap());
        assert_eq!(before.op(), after.op());
        assert_eq!(before.schema(), after.schema());
        let (left, right) = after.inputs();
        assert_eq!(left.source, before.inputs().0.source);
        assert_eq!(right.map(|r| r.source.clone()), before.inputs().1.map(|r| r.source.clone()));

        // The scheduler plans the decoded table; the operator travels to an executor, which
        // chooses its backend: the CPU here, where the query left device=auto.
        // kNN on a cluster: the merge of the tasks' lists over a repartition by query over the
        // operator.
        let merge = decoded.scan(&ctx.state(), None, &[], None).await.unwrap();
        let planner = PhysicalCodec::new(Role::Planner);
        let executor = PhysicalCodec::new(Role::Executor { device: Device::Cpu });
        let converter = datafusion_proto::physical_plan::DefaultPhysicalProtoConverter {};
        let mut bytes = Vec::new();
        planner.try_encode(merge.clone(), &mut bytes, &converter).unwrap();
        let repartition: Vec<_> = merge.children().into_iter().cloned().collect();
        let merge_after = executor.try_decode(&bytes, &repartition, &task, &converter).unwrap();
        let (before, after) =
            (merge.downcast_ref::<KnnMergeExec>().unwrap(), merge_after.downcast_ref::<KnnMergeExec>().unwrap());
        assert_eq!((after.k(), after.rank()), (2, Some(table.schema().fields().len() - 1)));
        assert_eq!((after.k(), after.rank(), after.schema()), (before.k(), before.rank(), before.schema()));
        let plan = repartition[0].children()[0].clone();
        let exec = plan.downcast_ref::<SimilarityExec>().expect("the operator");
        assert!(exec.tasks().is_some_and(|t| t >= 1));
        let mut bytes = Vec::new();
        planner.try_encode(plan.clone(), &mut bytes, &converter).unwrap();
        let children: Vec<_> = plan.children().into_iter().cloned().collect();
        let decoded = executor.try_decode(&bytes, &children, &task, &converter).unwrap();
        let exec_after = decoded.downcast_ref::<SimilarityExec>().unwrap();
        assert_eq!(exec_after.op().device, Device::Cpu);
        let devices = exec.op().devices.clone();
        assert_eq!(SimilarityOp { device: Device::Auto, devices, ..exec_after.op().clone() }, *exec.op());
        assert_eq!(exec_after.tasks(), exec.tasks());
        assert_eq!(exec_after.columns(), exec.columns());
        assert_eq!(exec_after.schema(), exec.schema());
        assert_eq!(
            exec_after.properties().partitioning.partition_count(),
            exec.properties().partitioning.partition_count()
        );
        assert_eq!(exec_after.backend_name(), "cpu");

        // Each input, read whole by every task, travels as a marker over its own child.
        let mut bytes = Vec::new();
        planner.try_encode(children[0].clone(), &mut bytes, &converter).unwrap();
        let grandchildren: Vec<_> = children[0].children().into_iter().cloned().collect();
        let whole = executor.try_decode(&bytes, &grandchildren, &task, &converter).unwrap();
        assert!(whole.downcast_ref::<WholeInputExec>().is_some());
        // A node that is not simjoin's goes to Ballista's codec (which has no use for a scan).
        let mut bytes = Vec::new();
        assert!(planner.try_encode(grandchildren[0].clone(), &mut bytes, &converter).is_err());
    }
}
