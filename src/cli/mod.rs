//! The command line: what `shardcron` accepts, one module per topic. Raw arguments become
//! validated values here, at the edge; the library below never sees a flag.
//!
//! - `args`: where the config and the cluster are found, and instants as flags spell them.
//! - [`check`]: `check`, `next` and `plan`: the config and its schedules, without a cluster.
//! - [`node`], `node_args` and `node_start`: `run`, a node's flags, their validation into one
//!   value, and the start it orchestrates, with its signals.
//! - [`dev`]: `dev`, nodes on a throwaway etcd, one or a few to watch a failover.
//! - [`control`]: `trigger`, `pause` and `resume`: asking the fleet through etcd.
//! - [`reading`]: `status` and `history`: what etcd holds, printed.
//! - [`docs`]: shell completions and the manual page.
//!
//! The binary parses, dispatches, and prints the error chain once; a closed stdout (`| head`) is
//! no error ([`is_broken_pipe`]).

mod args;
pub mod backfill;
pub mod check;
pub mod control;
pub mod dev;
pub mod docs;
pub mod node;
mod node_args;
mod node_secrets;
mod node_start;
pub mod reading;

use std::io::Write;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

pub use args::{format_instant, parse_instant, ClusterArg, ConfigArg, DEFAULT_CONFIG_PATHS};
pub use node_args::{LogFormat, NodeArgs};
pub use node_start::MIN_API_TOKEN;

/// `--version`: the version, the commit of a build from a checkout, and the time zone database
/// compiled in (a change of a zone's rules needs a rebuild: this says which rules a node uses).
pub fn version() -> &'static str {
    static VERSION: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    VERSION.get_or_init(|| {
        let commit =
            option_env!("SHARDCRON_GIT_COMMIT").map_or_else(String::new, |commit| format!("commit {commit}, "));
        format!(
            "{} ({commit}tzdb {})",
            env!("CARGO_PKG_VERSION"),
            chrono_tz::IANA_TZDB_VERSION
        )
    })
}

#[derive(Debug, Parser)]
#[command(
    name = "shardcron",
    version = version(),
    about = "A distributed cron: each job fires exactly once per tick across a fleet, coordinated through etcd"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Validate the config and print each job's shard, zone and next fire time.
    Check(check::CheckArgs),
    /// Print the next fire instants of a schedule expression.
    Next(check::NextArgs),
    /// Print every fire instant of the config's jobs in a window (default: the next 24 h), in
    /// time order, with a note where a DST rule decided the instant.
    Plan(check::PlanArgs),
    /// Run a node: campaign for shards and fire their jobs.
    Run(node::RunArgs),
    /// Show shard leaders, nodes and each job's last and next run.
    Status(reading::StatusArgs),
    /// Try shardcron: start a throwaway local etcd and run one node (or `--nodes N`) against it.
    Dev(dev::DevArgs),
    /// Run a job now, through its shard's leader: the same claim, fence, overlap policy and
    /// pause as a tick of its schedule, which does not move.
    Trigger(control::TriggerArgs),
    /// Run every tick of a job's schedule in a past range again, oldest first, through its
    /// shard's leader (`CRON_TRIGGER=backfill`, `CRON_SCHEDULED_AT` the tick), and show the
    /// progress; `--dry-run` prints the ticks, `--cancel` stops the rest.
    Backfill(backfill::BackfillArgs),
    /// Show a job's last runs, newest first, as kept in etcd (`[cluster] history`).
    History(reading::HistoryArgs),
    /// Pause jobs: from their next tick, every node claims their ticks and records them
    /// `paused` instead of running them, until `resume` or the pause's end.
    Pause(control::PauseArgs),
    /// End pauses: the jobs run again from their next tick; paused ticks are never caught up.
    Resume(control::ResumeArgs),
    /// Print a shell completion script: `shardcron completions bash > /etc/bash_completion.d/shardcron`.
    Completions(docs::CompletionsArgs),
    /// Print the manual page (roff): `shardcron man | man -l -`.
    Man,
}

/// Whether an error is a write to a reader that has gone (`shardcron plan | head`): the
/// command ends quietly then, as ripgrep does, since the reader took all it wanted. Only the
/// error itself is looked at, as writes to stdout return it with no context: a broken pipe deep
/// in an etcd error's chain is still an error.
pub fn is_broken_pipe(err: &anyhow::Error) -> bool {
    let kind = err
        .downcast_ref::<std::io::Error>()
        .map(std::io::Error::kind)
        .or_else(|| {
            err.downcast_ref::<serde_json::Error>()
                .and_then(serde_json::Error::io_error_kind)
        });
    kind == Some(std::io::ErrorKind::BrokenPipe)
}

/// `"; did you mean \"JOB\"?"` for the job of `config` closest to `name`, or nothing.
fn job_suggestion(config: &crate::rules::config::Config, name: &str) -> String {
    crate::rules::suggest::did_you_mean(name, config.jobs.iter().map(|job| job.name.as_str()))
}

/// Whether a command failed because no etcd member answered: the place for a hint on where
/// `dev`'s etcd is.
pub fn is_unreachable_etcd(err: &anyhow::Error) -> bool {
    err.chain()
        .filter_map(|cause| cause.downcast_ref::<crate::coord::etcd::CoordError>())
        .any(crate::coord::etcd::CoordError::is_unreachable)
}

/// Writes to stdout with the error returned: `print!` panics when the reader has gone.
fn print(text: std::fmt::Arguments) -> Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_fmt(text)?;
    out.flush()?;
    Ok(())
}

/// Runs a command's async part; only commands that talk to etcd or run a node start a runtime.
fn block_on<T, F: std::future::Future<Output = Result<T>>>(future: F) -> Result<T> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?
        .block_on(future)
}
