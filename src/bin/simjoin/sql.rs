//! `simjoin sql`: statements from the command line, a file or an interactive prompt.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion::dataframe::DataFrameWriteOptions;
use datafusion::datasource::MemTable;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::prelude::{CsvReadOptions, JsonReadOptions, ParquetReadOptions, SessionConfig, SessionContext};
use datafusion::sql::parser::DFParser;
use futures::StreamExt;
use rustyline::error::ReadlineError;

use super::progress::Bar;
use super::{Format, SessionArgs, SqlArgs};

/// Rows printed by the table format before the rest is only counted.
const MAX_TABLE_ROWS: usize = 1000;

/// A session with the simjoin functions, the progress bar, the device default and the tables.
pub async fn session(args: &SessionArgs) -> Result<SessionContext> {
    if let Some(url) = &args.cluster {
        return register_tables(simjoin::cluster::connect(url).await?.enable_url_table(), args).await;
    }
    let config = SessionConfig::new().with_extension(Arc::new(simjoin::Progress(Arc::new(Bar::default()))));
    // s3://, gs://, az:// and http(s):// paths work with credentials from the environment.
    let runtime = RuntimeEnvBuilder::new()
        .with_object_store_registry(Arc::new(simjoin::stores::RemoteStoreRegistry::new()))
        .with_memory_limit(args.memory_limit(), 1.0)
        .build_arc()?;
    // `SELECT … FROM 'points.parquet'` reads the file, as in datafusion-cli.
    register_tables(simjoin::session_context_with_config_rt(config, runtime).enable_url_table(), args).await
}

/// Sets the device default and the Parquet writer's options of `ctx` and registers the `--table`s.
pub async fn register_tables(ctx: SessionContext, args: &SessionArgs) -> Result<SessionContext> {
    ctx.sql(&format!("SET simjoin.device = '{}'", args.device)).await?;
    if let Some(codec) = &args.compression {
        ctx.sql(&format!("SET datafusion.execution.parquet.compression = '{codec}'")).await?;
    }
    if let Some(rows) = args.row_group_size {
        ctx.sql(&format!("SET datafusion.execution.parquet.max_row_group_size = {rows}")).await?;
    }
    for spec in &args.tables {
        let Some((name, path)) = spec.split_once('=') else {
            return Err(DataFusionError::Configuration(format!("--table expects NAME=PATH, got '{spec}'")));
        };
        register_file(&ctx, name.trim(), path.trim()).await?;
        if args.in_memory {
            keep_in_memory(&ctx, name.trim()).await?;
        }
    }
    Ok(ctx)
}

/// Replaces table `name` by an in-memory copy of its rows, so later queries read no file and the
/// conversion cache keeps its vectors (`exec::cache`). The copy keeps the file's scan order —
/// partition `p` holds the `p`-th file group's rows, read without work stealing, as the operator
/// reads a file — so kNN ties and the orientation of unordered pairs are those of the file
/// (collected into one partition, the rows came in whichever order the partitions finished).
pub async fn keep_in_memory(ctx: &SessionContext, name: &str) -> Result<()> {
    let mut state = ctx.state();
    state.config_mut().options_mut().execution.enable_file_stream_work_stealing = false;
    let df = SessionContext::new_with_state(state).table(name).await?;
    let schema = Arc::new(df.schema().as_arrow().clone());
    let partitions = df.collect_partitioned().await?;
    ctx.deregister_table(name)?;
    ctx.register_table(name, Arc::new(MemTable::try_new(schema, partitions)?))?;
    Ok(())
}

async fn register_file(ctx: &SessionContext, name: &str, path: &str) -> Result<()> {
    let lower = path.to_ascii_lowercase();
    if lower.ends_with(".csv") {
        ctx.register_csv(name, path, CsvReadOptions::new()).await
    } else if lower.ends_with(".tsv") {
        ctx.register_csv(name, path, CsvReadOptions::new().delimiter(b'\t').file_extension(".tsv")).await
    } else if lower.ends_with(".json") || lower.ends_with(".ndjson") {
        let ext = if lower.ends_with(".json") { ".json" } else { ".ndjson" };
        ctx.register_json(name, path, JsonReadOptions::default().file_extension(ext)).await
    } else {
        ctx.register_parquet(name, path, ParquetReadOptions::default()).await
    }
}

pub async fn run(args: SqlArgs) -> Result<()> {
    let ctx = session(&args.session).await?;
    let text = match (&args.query, &args.file) {
        (Some(q), None) => q.clone(),
        (None, Some(f)) => std::fs::read_to_string(f)
            .map_err(|e| DataFusionError::Execution(format!("cannot read {}: {e}", f.display())))?,
        (Some(_), Some(_)) => {
            return Err(DataFusionError::Configuration("give a query or --file, not both".into()));
        }
        (None, None) => return repl(&ctx, args.format).await,
    };
    run_statements(&ctx, &text, args.format, args.output.as_deref()).await
}

/// Runs every statement of `text`; `output` receives the last statement's result.
async fn run_statements(ctx: &SessionContext, text: &str, format: Format, output: Option<&Path>) -> Result<()> {
    let statements = DFParser::parse_sql(text)?;
    let count = statements.len();
    for (i, statement) in statements.into_iter().enumerate() {
        let plan = ctx.state().statement_to_plan(statement).await?;
        let df = ctx.execute_logical_plan(plan).await?;
        match output {
            Some(path) if i + 1 == count => write_file(df, path).await?,
            _ => print(df, format).await?,
        }
    }
    Ok(())
}

/// Writes `df` to `path`, or, stopped by SIGINT or SIGTERM or failing, leaves no file behind: the
/// writer stages its rows in `path#N` files and renames one onto `path` only when complete, so an
/// existing file is replaced whole or not at all, and the staging files of a write that did not
/// complete are removed here.
async fn write_file(df: datafusion::dataframe::DataFrame, path: &Path) -> Result<()> {
    let staged_before = staging_files(path);
    let result = tokio::select! {
        written = write_whole(df, path) => written,
        _ = super::serve::shutdown_signal() => Err(DataFusionError::Execution(format!("--output {}: stopped; no file written", path.display()))),
    };
    if result.is_err() {
        for staged in staging_files(path).difference(&staged_before) {
            let _ = std::fs::remove_file(staged);
        }
    }
    result
}

/// The writer's staging files of `path` (`path#1`, `path#2`, …) that exist now.
fn staging_files(path: &Path) -> std::collections::BTreeSet<std::path::PathBuf> {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else { return Default::default() };
    let dir = if dir.as_os_str().is_empty() { Path::new(".") } else { dir };
    let prefix = format!("{}#", name.to_string_lossy());
    let Ok(entries) = std::fs::read_dir(dir) else { return Default::default() };
    entries
        .filter_map(|entry| entry.ok())
        .filter(|entry| {
            let file = entry.file_name().to_string_lossy().to_string();
            file.strip_prefix(&prefix).is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        })
        .map(|entry| entry.path())
        .collect()
}

async fn write_whole(df: datafusion::dataframe::DataFrame, path: &Path) -> Result<()> {
    let name = path.to_string_lossy().to_string();
    let options = DataFrameWriteOptions::new().with_single_file_output(true);
    let lower = name.to_ascii_lowercase();
    let batches = if lower.ends_with(".csv") {
        df.write_csv(&name, options, None).await?
    } else if lower.ends_with(".json") {
        df.write_json(&name, options, None).await?
    } else if lower.ends_with(".parquet") {
        df.write_parquet(&name, options, None).await?
    } else {
        return Err(DataFusionError::Configuration(format!(
            "--output {name}: use a .parquet, .csv or .json file name"
        )));
    };
    let rows: u64 = batches
        .iter()
        .filter_map(|b| b.column(0).as_any().downcast_ref::<datafusion::arrow::array::UInt64Array>())
        .map(|c| c.value(0))
        .sum();
    eprintln!("wrote {rows} rows to {name}");
    Ok(())
}

/// Streams a result to stdout: CSV and JSON batch by batch, tables up to `MAX_TABLE_ROWS` rows.
async fn print(df: datafusion::dataframe::DataFrame, format: Format) -> Result<()> {
    let started = Instant::now();
    let mut stream = df.execute_stream().await?;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let io = |e: std::io::Error| DataFusionError::Execution(format!("writing output: {e}"));
    let mut rows = 0usize;
    match format {
        Format::Table => {
            let mut shown = Vec::new();
            let mut shown_rows = 0;
            while let Some(batch) = stream.next().await {
                let batch = batch?;
                rows += batch.num_rows();
                if shown_rows < MAX_TABLE_ROWS {
                    let take = batch.num_rows().min(MAX_TABLE_ROWS - shown_rows);
                    shown.push(shortened_lists(&batch.slice(0, take))?);
                    shown_rows += take;
                }
            }
            if !shown.is_empty() && !shown[0].schema().fields().is_empty() {
                writeln!(out, "{}", pretty_format_batches(&shown)?).map_err(io)?;
            }
            if rows > shown_rows {
                writeln!(out, "... {} more rows", rows - shown_rows).map_err(io)?;
            }
            out.flush().map_err(io)?;
            eprintln!("{rows} rows in {:.3} s", started.elapsed().as_secs_f64());
        }
        Format::Csv => {
            let mut writer = datafusion::arrow::csv::Writer::new(&mut out);
            while let Some(batch) = stream.next().await {
                writer.write(&batch?)?;
            }
        }
        Format::Json => {
            let mut writer = datafusion::arrow::json::LineDelimitedWriter::new(&mut out);
            while let Some(batch) = stream.next().await {
                writer.write(&batch?)?;
            }
            writer.finish()?;
        }
    }
    Ok(())
}

/// Elements a list shows in table output before the rest is elided.
const SHOWN_ELEMENTS: usize = 3;

/// `batch` with its list columns as text, a list of more than `SHOWN_ELEMENTS` + 1 elements
/// shortened to its first `SHOWN_ELEMENTS` and its last (`[0.49, -0.77, 0.12, …, -0.97]`), as
/// DuckDB prints vectors: a table row stays one screen line. CSV, JSON and files keep them whole.
fn shortened_lists(batch: &RecordBatch) -> Result<RecordBatch> {
    let is_list = |t: &DataType| matches!(t, DataType::List(_) | DataType::LargeList(_) | DataType::FixedSizeList(..));
    if !batch.schema().fields().iter().any(|f| is_list(f.data_type())) {
        return Ok(batch.clone());
    }
    let options = FormatOptions::default().with_null("NULL");
    let mut fields = Vec::with_capacity(batch.num_columns());
    let mut columns = Vec::with_capacity(batch.num_columns());
    for (field, column) in batch.schema().fields().iter().zip(batch.columns()) {
        if !is_list(field.data_type()) {
            fields.push(field.as_ref().clone());
            columns.push(column.clone());
            continue;
        }
        let text: StringArray = (0..column.len())
            .map(|row| -> Result<Option<String>> {
                if column.is_null(row) {
                    return Ok(None);
                }
                let values: ArrayRef = match column.data_type() {
                    DataType::List(_) => column.as_list::<i32>().value(row),
                    DataType::LargeList(_) => column.as_list::<i64>().value(row),
                    _ => column.as_fixed_size_list().value(row),
                };
                let format = ArrayFormatter::try_new(values.as_ref(), &options)?;
                let n = values.len();
                let shown: Vec<String> = if n > SHOWN_ELEMENTS + 1 {
                    let mut shown: Vec<String> = (0..SHOWN_ELEMENTS).map(|i| format.value(i).to_string()).collect();
                    shown.push("…".to_string());
                    shown.push(format.value(n - 1).to_string());
                    shown
                } else {
                    (0..n).map(|i| format.value(i).to_string()).collect()
                };
                Ok(Some(format!("[{}]", shown.join(", "))))
            })
            .collect::<Result<_>>()?;
        fields.push(Field::new(field.name(), DataType::Utf8, field.is_nullable()));
        columns.push(Arc::new(text) as ArrayRef);
    }
    Ok(RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)?)
}

/// The interactive prompt: statements end with `;` and may span lines. Ctrl-C while a statement
/// runs cancels it (the session and its tables stay); at the prompt it clears the line, and a
/// second one at an empty prompt quits, as `\q` and Ctrl-D do.
async fn repl(ctx: &SessionContext, format: Format) -> Result<()> {
    let mut editor = rustyline::DefaultEditor::new()
        .map_err(|e| DataFusionError::Execution(format!("cannot start the prompt: {e}")))?;
    let history = std::env::var_os("HOME").map(|h| Path::new(&h).join(".simjoin_history"));
    if let Some(h) = &history {
        let _ = editor.load_history(h);
    }
    println!(
        "simjoin {} — SQL with sim_join, range_query, knn. End statements with ';', \\q quits.",
        env!("CARGO_PKG_VERSION")
    );
    let mut buffer = String::new();
    let mut interrupted_empty = false;
    loop {
        let prompt = if buffer.is_empty() { "simjoin> " } else { "     ..> " };
        let read = editor.readline(prompt);
        if !matches!(read, Err(ReadlineError::Interrupted)) {
            interrupted_empty = false;
        }
        match read {
            Ok(line) => {
                let trimmed = line.trim();
                if buffer.is_empty() && (trimmed == "\\q" || trimmed == "quit" || trimmed == "exit") {
                    break;
                }
                buffer.push_str(&line);
                buffer.push('\n');
                if trimmed.ends_with(';') {
                    let _ = editor.add_history_entry(buffer.trim());
                    // Dropping the statement's future cancels its streams and tasks.
                    tokio::select! {
                        done = run_statements(ctx, &buffer, format, None) => {
                            if let Err(e) = done {
                                eprintln!("error: {}", e.strip_backtrace());
                            }
                        }
                        _ = tokio::signal::ctrl_c() => {
                            if let Some(progress) = ctx.state().config().get_extension::<simjoin::Progress>() {
                                progress.0.finish();
                            }
                            eprintln!("cancelled");
                        }
                    }
                    buffer.clear();
                }
            }
            Err(ReadlineError::Interrupted) if buffer.is_empty() && interrupted_empty => break,
            Err(ReadlineError::Interrupted) => {
                if buffer.is_empty() {
                    eprintln!("(Ctrl-C again, \\q or Ctrl-D quits)");
                }
                interrupted_empty = buffer.is_empty();
                buffer.clear();
            }
            Err(ReadlineError::Eof) => break,
            Err(e) => return Err(DataFusionError::Execution(format!("prompt failed: {e}"))),
        }
    }
    if let Some(h) = &history {
        let _ = editor.save_history(h);
    }
    Ok(())
}
