//! The command line: argument types and the small commands that need no cluster.

use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use chrono::{DateTime, SecondsFormat, Utc};
use clap::{Args, Parser, Subcommand};

use crate::config::{self, Config};
use crate::plan;
use crate::schedule::{parse_zone, Schedule, ScheduleError};
use crate::secrets::{self, Secret, Sources};

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
    Check(CheckArgs),
    /// Print the next fire instants of a schedule expression.
    Next(NextArgs),
    /// Print every fire instant of the config's jobs in a window (default: the next 24 h), in
    /// time order, with a note where a DST rule decided the instant.
    Plan(PlanArgs),
    /// Run a node: campaign for shards and fire their jobs.
    Run(RunArgs),
    /// Show shard leaders, nodes and each job's last and next run.
    Status(StatusArgs),
    /// Try shardcron: start a throwaway local etcd and run one node against it.
    Dev(DevArgs),
    /// Run a job now, through its shard's leader: the same claim, fence, overlap policy and
    /// pause as a tick of its schedule, which does not move.
    Trigger(TriggerArgs),
    /// Show a job's last runs, newest first, as kept in etcd (`[cluster] history`).
    History(HistoryArgs),
    /// Pause jobs: from their next tick, every node claims their ticks and records them
    /// `paused` instead of running them, until `resume` or the pause's end.
    Pause(PauseArgs),
    /// End pauses: the jobs run again from their next tick; paused ticks are never caught up.
    Resume(ResumeArgs),
    /// Print a shell completion script: `shardcron completions bash > /etc/bash_completion.d/shardcron`.
    Completions(CompletionsArgs),
    /// Print the manual page (roff): `shardcron man | man -l -`.
    Man,
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    #[command(flatten)]
    pub config: ConfigArg,
    /// Print the validated jobs as one JSON array: name, shard, zone, schedule, next.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell to complete for.
    pub shell: clap_complete::Shell,
}

/// `completions SHELL`: generated from the same definitions that parse the arguments.
pub fn completions(args: &CompletionsArgs) -> Result<()> {
    use clap::CommandFactory;
    let mut command = Cli::command();
    clap_complete::generate(args.shell, &mut command, "shardcron", &mut std::io::stdout());
    Ok(())
}

/// `man`: the manual page, from the same definitions, with a section per subcommand.
pub fn man() -> Result<()> {
    use clap::CommandFactory;
    let command = Cli::command();
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let page = clap_mangen::Man::new(command.clone());
    page.render_title(&mut out)?;
    page.render_name_section(&mut out)?;
    page.render_synopsis_section(&mut out)?;
    page.render_description_section(&mut out)?;
    page.render_options_section(&mut out)?;
    for sub in command.get_subcommands().filter(|sub| !sub.is_hide_set()) {
        writeln!(out, ".SH \"SHARDCRON {}\"", sub.get_name().to_uppercase())?;
        let sub_page = clap_mangen::Man::new(sub.clone().bin_name(format!("shardcron {}", sub.get_name())));
        sub_page.render_synopsis_section(&mut out)?;
        sub_page.render_description_section(&mut out)?;
        sub_page.render_options_section(&mut out)?;
    }
    page.render_version_section(&mut out)?;
    writeln!(out, ".SH FILES\n.TP\n/etc/shardcron/jobs.toml\nThe jobs, when neither --config nor SHARDCRON_CONFIG names a file and ./config/jobs.toml does not exist.")?;
    out.flush()?;
    Ok(())
}

#[derive(Debug, Args)]
pub struct ConfigArg {
    /// Path of jobs.toml. Default: ./config/jobs.toml if it exists, else
    /// /etc/shardcron/jobs.toml.
    #[arg(long, env = "SHARDCRON_CONFIG", value_name = "PATH")]
    pub config: Option<PathBuf>,
}

/// Where a config is looked for when neither `--config` nor `SHARDCRON_CONFIG` names one, in
/// order: a checkout's or working directory's own, then the installed one.
pub const DEFAULT_CONFIG_PATHS: [&str; 2] = ["config/jobs.toml", "/etc/shardcron/jobs.toml"];

impl ConfigArg {
    /// The config file: `--config`, then `SHARDCRON_CONFIG`, then the first of
    /// [`DEFAULT_CONFIG_PATHS`] that exists. The error names every place looked at.
    pub fn path(&self) -> Result<PathBuf> {
        if let Some(path) = &self.config {
            return Ok(path.clone());
        }
        DEFAULT_CONFIG_PATHS
            .iter()
            .map(PathBuf::from)
            .find(|path| path.exists())
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "no config file: --config not given, SHARDCRON_CONFIG not set, and neither {} (in {}) nor {} exists",
                    DEFAULT_CONFIG_PATHS[0],
                    std::env::current_dir().map_or_else(|_| "the working directory".to_string(), |dir| dir.display().to_string()),
                    DEFAULT_CONFIG_PATHS[1]
                )
            })
    }

    pub fn load(&self) -> Result<Config> {
        Ok(config::load(&self.path()?)?)
    }
}

/// The config and the etcd endpoints of a command that talks to the cluster.
#[derive(Debug, Args)]
pub struct ClusterArg {
    #[command(flatten)]
    pub config: ConfigArg,
    /// etcd endpoints, comma-separated; overrides [etcd] endpoints.
    #[arg(long, env = "SHARDCRON_ENDPOINTS", value_delimiter = ',')]
    pub endpoints: Vec<String>,
}

#[derive(Debug, Args)]
pub struct NextArgs {
    /// A crontab expression: 5 fields, 6 with leading seconds, or @daily and friends.
    pub expression: String,
    /// IANA time zone the expression is read in.
    #[arg(long, default_value = "UTC")]
    pub tz: String,
    /// Start instant (RFC 3339); the instants printed are strictly after it. Default: now.
    #[arg(long)]
    pub from: Option<String>,
    /// How many instants to print (at most 100,000).
    #[arg(short = 'n', default_value_t = 5, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=100_000))]
    pub count: usize,
    /// The job whose name gives the values of `H` items (hash-spread schedules).
    #[arg(long, value_name = "NAME")]
    pub job: Option<String>,
}

#[derive(Debug, Args)]
pub struct PlanArgs {
    #[command(flatten)]
    pub config: ConfigArg,
    /// Start of the window (RFC 3339), included. Default: now.
    #[arg(long)]
    pub from: Option<String>,
    /// End of the window (RFC 3339), excluded. Default: 24 h after --from.
    #[arg(long, conflicts_with = "for_")]
    pub to: Option<String>,
    /// Length of the window instead of --to, such as 90m or 7d (at most 100 years).
    #[arg(long = "for", id = "for_", value_name = "DURATION", value_parser = crate::bounds::window)]
    pub for_: Option<Duration>,
    /// Only this job; repeat for several. Default: every job.
    #[arg(long = "job", value_name = "NAME")]
    pub jobs: Vec<String>,
    /// Print a JSON array of objects instead of text.
    #[arg(long)]
    pub json: bool,
    /// Print at most this many instants (at most 1,000,000); a longer plan is cut, with an error.
    #[arg(long, default_value_t = 100_000, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1_000_000))]
    pub limit: usize,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub config: ConfigArg,
    #[command(flatten)]
    pub node: NodeArgs,
}

/// Options of a running node, shared by `run` and `dev`.
#[derive(Debug, Args, Clone)]
pub struct NodeArgs {
    /// This node's id in etcd and in CRON_NODE. Default: the host name.
    #[arg(long, env = "SHARDCRON_NODE_ID")]
    pub node_id: Option<String>,
    /// etcd endpoints, comma-separated; overrides [etcd] endpoints.
    #[arg(long, env = "SHARDCRON_ENDPOINTS", value_delimiter = ',')]
    pub endpoints: Vec<String>,
    /// On SIGTERM/SIGINT, how long running commands may go on before they are killed (at most
    /// 1 day).
    #[arg(long, env = "SHARDCRON_SHUTDOWN_GRACE", default_value = "30s", value_parser = crate::bounds::wait)]
    pub shutdown_grace: Duration,
    /// Serve HTTP at HOST:PORT (a bare PORT: on loopback only): /healthz, /readyz, /metrics,
    /// the JSON API under /api/v1 and the dashboard at /. Also spelled --metrics-addr (and
    /// SHARDCRON_METRICS_ADDR), its name before it served more than metrics.
    #[arg(long, env = "SHARDCRON_HTTP_ADDR", value_name = "HOST:PORT", alias = "metrics-addr", value_parser = parse_listen_address)]
    pub http_addr: Option<std::net::SocketAddr>,
    /// The most HTTP connections open at once; more wait until one closes. At most half the
    /// node's descriptor limit is used, so clients never take the descriptors runs need.
    #[arg(long, env = "SHARDCRON_HTTP_MAX_CONNECTIONS", value_name = "N", default_value_t = shardcron_http_default_connections(), value_parser = clap::value_parser!(u32).range(1..=65_536))]
    pub http_max_connections: u32,
    /// Host names HTTP requests may name besides the listen address and loopback (a name, or
    /// NAME:PORT), comma-separated; requests for any other `Host` get 421.
    #[arg(
        long,
        env = "SHARDCRON_HTTP_ALLOWED_HOSTS",
        value_name = "HOSTS",
        value_delimiter = ','
    )]
    pub http_allowed_hosts: Vec<String>,
    /// The environment variable that holds the bearer token API writes (trigger, pause,
    /// resume) need (at least 16 bytes). Without a token (this, --api-token-file or the systemd
    /// credential api-token) every write answers 403. Jobs never see the variable.
    #[arg(
        long,
        env = "SHARDCRON_API_TOKEN_ENV",
        value_name = "VAR",
        conflicts_with = "api_token_file"
    )]
    pub api_token_env: Option<String>,
    /// A file holding the API's write token, readable by the node's user only (mode 0600 or
    /// 0400). Without this or --api-token-env, the systemd credential api-token is used if given.
    #[arg(long, env = "SHARDCRON_API_TOKEN_FILE", value_name = "PATH")]
    pub api_token_file: Option<PathBuf>,
    /// The environment variable that holds the bearer token API reads need (at least 16
    /// bytes); probes and /metrics need none. Without a read token (this, --api-read-token-file
    /// or the systemd credential api-read-token) reads are open.
    #[arg(
        long,
        env = "SHARDCRON_API_READ_TOKEN_ENV",
        value_name = "VAR",
        conflicts_with = "api_read_token_file"
    )]
    pub api_read_token_env: Option<String>,
    /// A file holding the API's read token, readable by the node's user only.
    #[arg(long, env = "SHARDCRON_API_READ_TOKEN_FILE", value_name = "PATH")]
    pub api_read_token_file: Option<PathBuf>,
    /// Log lines as human-readable text or as one JSON object per line.
    #[arg(long, env = "SHARDCRON_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

impl NodeArgs {
    /// Where to serve HTTP: `--http-addr`, else the older `SHARDCRON_METRICS_ADDR`.
    pub fn listen_address(&self) -> Result<Option<std::net::SocketAddr>> {
        if self.http_addr.is_some() {
            return Ok(self.http_addr);
        }
        match std::env::var("SHARDCRON_METRICS_ADDR") {
            Ok(value) if !value.trim().is_empty() => parse_listen_address(&value)
                .map(Some)
                .map_err(|err| anyhow::anyhow!("SHARDCRON_METRICS_ADDR: {err}")),
            _ => Ok(None),
        }
    }

    /// The API's write token: from the variable `--api-token-env` names, the file
    /// `--api-token-file` names, or the systemd credential `api-token`.
    pub fn api_token(&self) -> Result<Option<Secret>> {
        api_token(Sources {
            what: "the API token (--api-token-env, --api-token-file, credential api-token)",
            env: self.api_token_env.as_deref(),
            file: self.api_token_file.as_deref(),
            credential: secrets::API_TOKEN_CREDENTIAL,
        })
    }

    /// The API's read token, found as the write token is.
    pub fn api_read_token(&self) -> Result<Option<Secret>> {
        api_token(Sources {
            what: "the API read token (--api-read-token-env, --api-read-token-file, credential api-read-token)",
            env: self.api_read_token_env.as_deref(),
            file: self.api_read_token_file.as_deref(),
            credential: secrets::API_READ_TOKEN_CREDENTIAL,
        })
    }

    /// The variables that hold the node's secrets, which its jobs must not see.
    pub fn secret_variables(&self) -> impl Iterator<Item = &str> {
        [&self.api_token_env, &self.api_read_token_env]
            .into_iter()
            .filter_map(|var| var.as_deref())
    }
}

/// The shortest API token a node accepts: a short one is guessed by trying.
pub const MIN_API_TOKEN: usize = 16;

/// A token, with the blanks around it dropped (a stray newline or space is never meant), and
/// refused if shorter than [`MIN_API_TOKEN`].
fn api_token(sources: Sources) -> Result<Option<Secret>> {
    let Some(mut token) = secrets::load(sources)? else {
        return Ok(None);
    };
    token.value = token.value.trim().to_string();
    anyhow::ensure!(
        token.value.len() >= MIN_API_TOKEN,
        "{}: the token from the {} is {} bytes long; it must be at least {MIN_API_TOKEN} (such as `openssl rand -hex 32`)",
        sources.what,
        token.origin,
        token.value.len()
    );
    Ok(Some(token))
}

fn shardcron_http_default_connections() -> u32 {
    crate::http::DEFAULT_MAX_CONNECTIONS as u32
}

/// `HOST:PORT`, or a bare `PORT` on loopback: the listener is never public unless asked.
fn parse_listen_address(value: &str) -> Result<std::net::SocketAddr, String> {
    if let Ok(port) = value.trim().parse::<u16>() {
        return Ok(std::net::SocketAddr::from(([127, 0, 0, 1], port)));
    }
    value
        .trim()
        .parse()
        .map_err(|_| format!("{value:?} is not HOST:PORT (such as 127.0.0.1:9464) or a port"))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub cluster: ClusterArg,
    /// Print one JSON document instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct TriggerArgs {
    #[command(flatten)]
    pub cluster: ClusterArg,
    /// The job to run.
    pub job: String,
    /// Wait for the run and exit with its exit status (1 for a timeout, kill, spawn failure,
    /// or a run that did not happen: skipped, paused, lost).
    #[arg(long)]
    pub wait: bool,
    /// How long a leader has to take the request before it is withdrawn (exit 1; at most 1 day).
    #[arg(long, default_value = "10s", value_parser = crate::bounds::wait)]
    pub timeout: Duration,
}

#[derive(Debug, Args)]
pub struct HistoryArgs {
    #[command(flatten)]
    pub cluster: ClusterArg,
    /// The job.
    pub job: String,
    /// How many runs to show.
    #[arg(short = 'n', default_value_t = 20)]
    pub count: usize,
    /// Print a JSON array of run records instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct PauseArgs {
    #[command(flatten)]
    pub cluster: ClusterArg,
    /// The jobs to pause.
    #[arg(value_name = "JOB", required_unless_present = "all", conflicts_with = "all")]
    pub jobs: Vec<String>,
    /// Pause every job, including jobs added to the config later.
    #[arg(long)]
    pub all: bool,
    /// End the pause by itself at this instant (RFC 3339).
    #[arg(long, conflicts_with = "for_")]
    pub until: Option<String>,
    /// End the pause by itself after this long, such as 2h (at most 100 years).
    #[arg(long = "for", id = "for_", value_name = "DURATION", value_parser = crate::bounds::window)]
    pub for_: Option<Duration>,
    /// Why: shown by `status` and logged by the nodes.
    #[arg(long)]
    pub reason: Option<String>,
}

#[derive(Debug, Args)]
pub struct ResumeArgs {
    #[command(flatten)]
    pub cluster: ClusterArg,
    /// The jobs to resume.
    #[arg(value_name = "JOB", required_unless_present = "all", conflicts_with = "all")]
    pub jobs: Vec<String>,
    /// End every pause: each job's and `pause --all`.
    #[arg(long)]
    pub all: bool,
}

impl PauseArgs {
    /// The pause asked for, made at `now`.
    pub fn pause(&self, now: DateTime<Utc>) -> Result<crate::pauses::Pause> {
        let until = parse_instant("--until", self.until.as_deref())?;
        crate::pauses::Pause::asked(now, until, self.for_, self.reason.clone()).map_err(|refused| match refused {
            crate::pauses::PauseRefused::EndsBeforeItStarts => {
                anyhow::anyhow!("the pause would end before it starts: --until must be in the future")
            }
            crate::pauses::PauseRefused::TooLong => anyhow::anyhow!("--for is too long"),
            crate::pauses::PauseRefused::ReasonTooLong => {
                anyhow::anyhow!("--reason is longer than {} bytes", crate::pauses::MAX_REASON)
            }
        })
    }
}

#[derive(Debug, Args)]
pub struct DevArgs {
    #[command(flatten)]
    pub config: ConfigArg,
    #[command(flatten)]
    pub node: NodeArgs,
    /// The etcd binary to start.
    #[arg(long, env = "SHARDCRON_ETCD_BIN", default_value = "etcd")]
    pub etcd_bin: PathBuf,
}

/// RFC 3339 with the zone's own offset, as operators read it (`2027-03-14T03:00:00-04:00`).
pub fn format_instant(instant: DateTime<Utc>, zone: chrono_tz::Tz) -> String {
    instant.with_timezone(&zone).to_rfc3339_opts(SecondsFormat::Secs, false)
}

/// One job of `check --json`; the keys are a contract.
#[derive(serde::Serialize)]
struct CheckedJob<'a> {
    name: &'a str,
    shard: u32,
    zone: &'a str,
    /// As it fires: `H` items expanded, a list joined by `" | "`.
    schedule: &'a str,
    /// In the job's zone, with its offset; `null` for a schedule that never fires again.
    next: Option<String>,
}

pub fn check(args: &CheckArgs) -> Result<()> {
    let config = args.config.load()?;
    let now = Utc::now();
    let mut next_by_schedule: HashMap<*const Schedule, Option<DateTime<Utc>>> = HashMap::new();
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    if args.json {
        // One element at a time: a million jobs are never one JSON tree in memory.
        write!(out, "[")?;
    }
    for (index, job) in config.jobs.iter().enumerate() {
        let next = *next_by_schedule
            .entry(std::sync::Arc::as_ptr(&job.schedule))
            .or_insert_with(|| job.schedule.next_after(now));
        let zone = job.schedule.zone();
        let next = next.map(|next| format_instant(next, zone));
        if args.json {
            let separator = if index == 0 { "\n  " } else { ",\n  " };
            write!(out, "{separator}")?;
            serde_json::to_writer(
                &mut out,
                &CheckedJob {
                    name: &job.name,
                    shard: job.shard,
                    zone: zone.name(),
                    schedule: job.schedule.expanded(),
                    next,
                },
            )?;
            continue;
        }
        writeln!(
            out,
            "{} shard={} zone={} next={} schedule=\"{}\"",
            job.name,
            job.shard,
            zone,
            next.as_deref().unwrap_or("never"),
            job.schedule.expanded()
        )?;
    }
    if args.json {
        writeln!(out, "{}]", if config.jobs.is_empty() { "" } else { "\n" })?;
    }
    out.flush()?;
    eprintln!(
        "{}: ok: {} jobs in {} shards, cluster {:?}",
        config.path.display(),
        config.jobs.len(),
        config.cluster.shards,
        config.cluster.name
    );
    Ok(())
}

pub fn next(args: &NextArgs) -> Result<()> {
    let zone = parse_zone(&args.tz).map_err(anyhow::Error::msg).context("--tz")?;
    let schedule =
        Schedule::parse_for_job(&[&args.expression], zone, args.job.as_deref()).map_err(|err| match err {
            ScheduleError::NeedsJob { .. } => anyhow::anyhow!("{err} with --job NAME"),
            err => err.into(),
        })?;
    let mut cursor = parse_instant("--from", args.from.as_deref())?.unwrap_or_else(Utc::now);
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    for _ in 0..args.count {
        let Some(next) = schedule.next_after(cursor) else {
            break;
        };
        writeln!(out, "{}", format_instant(next, zone))?;
        cursor = next;
    }
    Ok(())
}

pub fn parse_instant(flag: &str, value: Option<&str>) -> Result<Option<DateTime<Utc>>> {
    value
        .map(|value| {
            DateTime::parse_from_rfc3339(value)
                .map(|instant| instant.with_timezone(&Utc))
                .with_context(|| {
                    format!("{flag} {value:?} is not an RFC 3339 instant such as 2027-03-14T01:00:00-05:00")
                })
        })
        .transpose()
}

pub fn plan(args: &PlanArgs) -> Result<()> {
    let config = args.config.load()?;
    let from = parse_instant("--from", args.from.as_deref())?.unwrap_or_else(Utc::now);
    let to = match (parse_instant("--to", args.to.as_deref())?, args.for_) {
        (Some(to), _) => to,
        (None, Some(length)) => chrono::Duration::from_std(length)
            .ok()
            .and_then(|length| from.checked_add_signed(length))
            .context("--for reaches past the last instant a date can hold")?,
        (None, None) => from + chrono::Duration::hours(24),
    };
    anyhow::ensure!(to > from, "the window is empty: --to must be after --from");
    if let Some(unknown) = args
        .jobs
        .iter()
        .find(|name| !config.jobs.iter().any(|job| job.name == **name))
    {
        anyhow::bail!("--job {unknown:?}: no such job in {}", config.path.display());
    }
    // In the config's order whatever the order of --job, so jobs due at one instant are listed
    // alike by every call.
    let jobs: Vec<&config::Job> = config
        .jobs
        .iter()
        .filter(|job| args.jobs.is_empty() || args.jobs.contains(&job.name))
        .collect();
    let (fires, cut) = plan::fires(&jobs, from, to, args.limit);
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    if args.json {
        let fires: Vec<plan::PlannedFire> = fires.iter().map(plan::PlannedFire::from).collect();
        serde_json::to_writer_pretty(&mut out, &fires)?;
        writeln!(out)?;
    } else {
        for fire in &fires {
            let zone = fire.job.schedule.zone();
            write!(
                out,
                "{} {} shard={} zone={}",
                format_instant(fire.at, zone),
                fire.job.name,
                fire.job.shard,
                zone
            )?;
            match fire.dst {
                Some(rule) => writeln!(out, " note=\"{}\"", rule.note())?,
                None => writeln!(out)?,
            }
        }
    }
    out.flush()?;
    if cut {
        let last = fires.last().map_or(from, |fire| fire.at);
        anyhow::bail!(
            "the plan was cut after {} instants (the last at {}): narrow the window (--for, --to), pick jobs (--job) or raise --limit",
            fires.len(),
            last.to_rfc3339_opts(SecondsFormat::Secs, true)
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn an_api_token_is_trimmed_and_must_be_at_least_16_bytes() {
        let dir = tempfile::tempdir().expect("dir");
        let token = |text: &str| {
            let path = dir.path().join("token");
            std::fs::write(&path, text).expect("write");
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
            api_token(Sources {
                what: "the test token",
                env: None,
                file: Some(&path),
                credential: "unused",
            })
        };
        let got = token(" 0123456789abcdef \n").expect("16 bytes").expect("a token");
        assert_eq!(got.value, "0123456789abcdef");
        let err = token("0123456789abcde\n").expect_err("15 bytes").to_string();
        assert!(err.contains("15 bytes") && err.contains("at least 16"), "{err}");
        assert!(!err.contains("0123456789abcde"), "the error shows the token: {err}");
    }
}
