//! The binary: parse, dispatch to [`shardcron::cli`], print the error chain once, exit.

use std::io::IsTerminal;
use std::process::ExitCode;

use anyhow::Result;
use clap::Parser;
use shardcron::cli::{self, Cli, Command, LogFormat};

fn main() -> ExitCode {
    shardcron::memory::limit_arenas();
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Check(args) => cli::check::check(args),
        Command::Completions(args) => cli::docs::completions(args),
        Command::Man => cli::docs::man(),
        Command::Next(args) => cli::check::next(args),
        Command::Plan(args) => cli::check::plan(args),
        Command::Run(args) => cli::node::load(&args.config).and_then(|config| {
            let _log_written_out = init_logging(args.node.log_format);
            cli::node::run(config, &args.node)
        }),
        Command::Dev(args) => cli::node::load(&args.config).and_then(|config| {
            let _log_written_out = init_logging(args.node.log_format);
            cli::dev::dev(config, args)
        }),
        Command::Status(args) => cli::reading::status(args),
        Command::History(args) => cli::reading::history(args),
        Command::Trigger(args) => return exit(cli::control::trigger(args)),
        Command::Backfill(args) => return exit(cli::backfill::backfill(args)),
        Command::Pause(args) => cli::control::pause(args),
        Command::Resume(args) => cli::control::resume(args),
    };
    exit(result.map(|()| ExitCode::SUCCESS))
}

/// The exit status: the command's own, or 1 with the error chain on one line. A reader that
/// closed the pipe early took all it wanted: that ends the command quietly, with 0.
fn exit(result: Result<ExitCode>) -> ExitCode {
    match result {
        Ok(code) => code,
        Err(err) if cli::is_broken_pipe(&err) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("shardcron: error: {err:#}");
            if cli::is_unreachable_etcd(&err) {
                eprintln!("shardcron: hint: `shardcron dev` serves etcd at the endpoint its config names when that port is free, else prints the `export SHARDCRON_ENDPOINTS=...` line to paste here");
            }
            ExitCode::FAILURE
        }
    }
}

/// Lines buffered for a slow log destination before new ones are dropped (and counted).
const LOG_BUFFER_LINES: usize = 10_000;

/// Logs go through a writer thread: a slow destination (a full pipe, a stalled journald) must
/// not hold up the runtime threads that spawn runs and renew the lease. Past the buffer, lines
/// are dropped and counted in `shardcron_log_lines_dropped_total` rather than block them. The
/// returned guard writes out what is buffered when it is dropped.
fn init_logging(format: LogFormat) -> tracing_appender::non_blocking::WorkerGuard {
    let filter = tracing_subscriber::EnvFilter::try_from_env("SHARDCRON_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let (writer, guard) = tracing_appender::non_blocking::NonBlockingBuilder::default()
        .lossy(true)
        .buffered_lines_limit(LOG_BUFFER_LINES)
        .thread_name("shardcron-log")
        // The writer thread flushes after each batch it takes off the channel: one write a
        // batch instead of one a line (two lines a run, thousands of runs a second in a burst).
        .finish(std::io::BufWriter::with_capacity(64 * 1024, std::io::stderr()));
    shardcron::metrics::count_log_drops(writer.error_counter());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(writer);
    let _ = match format {
        LogFormat::Text => builder.with_ansi(std::io::stderr().is_terminal()).try_init(),
        // One object per line: the event's fields (job, tick, stream, fence...) are keys of
        // `fields`, its spans' fields too, and the message is `fields.message`.
        LogFormat::Json => builder
            .fmt_fields(shardcron::log_format::span_fields())
            .event_format(shardcron::log_format::JsonWithSpans)
            .try_init(),
    };
    guard
}
