//! `simjoin sql`: statements from the command line, a file or an interactive prompt.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

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

async fn write_file(df: datafusion::dataframe::DataFrame, path: &Path) -> Result<()> {
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
                    shown.push(batch.slice(0, take));
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

/// The interactive prompt: statements end with `;` and may span lines; `\q` quits.
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
    loop {
        let prompt = if buffer.is_empty() { "simjoin> " } else { "     ..> " };
        match editor.readline(prompt) {
            Ok(line) => {
                let trimmed = line.trim();
                if buffer.is_empty() && (trimmed == "\\q" || trimmed == "quit" || trimmed == "exit") {
                    break;
                }
                buffer.push_str(&line);
                buffer.push('\n');
                if trimmed.ends_with(';') {
                    let _ = editor.add_history_entry(buffer.trim());
                    if let Err(e) = run_statements(ctx, &buffer, format, None).await {
                        eprintln!("error: {}", e.strip_backtrace());
                    }
                    buffer.clear();
                }
            }
            Err(ReadlineError::Interrupted) => buffer.clear(),
            Err(ReadlineError::Eof) => break,
            Err(e) => return Err(DataFusionError::Execution(format!("prompt failed: {e}"))),
        }
    }
    if let Some(h) = &history {
        let _ = editor.save_history(h);
    }
    Ok(())
}
