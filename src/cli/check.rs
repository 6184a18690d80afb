//! `check`, `next` and `plan`: the config and its schedules, read without a cluster.

use std::collections::HashMap;
use std::io::Write;
use std::time::Duration;

use anyhow::{Context, Result};
use chrono::{DateTime, SecondsFormat, Utc};
use clap::Args;

use super::{format_instant, parse_instant, ConfigArg};
use crate::rules::config::{self, Config, Job};
use crate::rules::plan;
use crate::rules::pools::FanOut;
use crate::rules::schedule::{parse_zone, Schedule, ScheduleError};

#[derive(Debug, Args)]
pub struct CheckArgs {
    #[command(flatten)]
    pub config: ConfigArg,
    /// Print the validated jobs as one JSON array: name, shard, zone, schedule, next.
    #[arg(long)]
    pub json: bool,
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
    #[arg(long = "for", id = "for_", value_name = "DURATION", value_parser = crate::rules::bounds::window)]
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

impl PlanArgs {
    /// The window `[from, to)`, never empty.
    fn window(&self) -> Result<(DateTime<Utc>, DateTime<Utc>)> {
        let from = parse_instant("--from", self.from.as_deref())?.unwrap_or_else(Utc::now);
        let to = match (parse_instant("--to", self.to.as_deref())?, self.for_) {
            (Some(to), _) => to,
            (None, Some(length)) => chrono::Duration::from_std(length)
                .ok()
                .and_then(|length| from.checked_add_signed(length))
                .context("--for reaches past the last instant a date can hold")?,
            (None, None) => from + chrono::Duration::hours(24),
        };
        anyhow::ensure!(to > from, "the window is empty: --to must be after --from");
        Ok((from, to))
    }

    /// The jobs `--job` names, every one known, in the config's order whatever the order of
    /// `--job`, so jobs due at one instant are listed alike by every call.
    fn jobs<'a>(&self, config: &'a Config) -> Result<Vec<&'a config::Job>> {
        if let Some(unknown) = self
            .jobs
            .iter()
            .find(|name| !config.jobs.iter().any(|job| job.name == **name))
        {
            anyhow::bail!("--job {unknown:?}: no such job in {}", config.path.display());
        }
        Ok(config
            .jobs
            .iter()
            .filter(|job| self.jobs.is_empty() || self.jobs.contains(&job.name))
            .map(|job| &**job)
            .collect())
    }
}

/// One job of `check --json`; the keys are a contract.
#[derive(serde::Serialize)]
struct CheckedJob<'a> {
    name: &'a str,
    /// The shard within the job's pool (or within the fleet's `shards`).
    shard: u32,
    /// The job's pool: its `run_on` tags joined by `+`; `null` for a job that runs anywhere.
    pool: Option<String>,
    fan_out: FanOut,
    /// The job's concurrency group; left out for a job in none.
    #[serde(skip_serializing_if = "Option::is_none")]
    group: Option<&'a str>,
    zone: &'a str,
    /// As it fires: `H` items expanded, a list joined by `" | "`.
    schedule: &'a str,
    /// In the job's zone, with its offset; `null` for a schedule that never fires again.
    next: Option<String>,
    /// The blackouts whose spans the job's ticks are skipped in, the cluster's first; left out
    /// when none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    blackouts: Vec<&'a str>,
    /// The notifiers told of its transitions; left out when none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    notify: Vec<&'a str>,
    /// Whether a success pings `ping_url` (never the URL: it is a secret).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    ping: bool,
}

/// The names of the blackouts and notifiers a job lists, and whether it pings: ` blackouts=a,b
/// notify=ops ping`, each left out when it has none.
fn telling(job: &Job) -> String {
    let mut text = String::new();
    let names = |list: Vec<&str>| list.join(",");
    if !job.blackouts.is_empty() {
        text += &format!(
            " blackouts={}",
            names(job.blackouts.iter().map(|b| b.name.as_str()).collect())
        );
    }
    if !job.notify.is_empty() {
        text += &format!(
            " notify={}",
            names(job.notify.iter().map(|n| n.name.as_str()).collect())
        );
    }
    if job.ping.is_some() {
        text += " ping";
    }
    text
}

/// The job's pool (its `run_on` tags joined by `+`); `None` without `run_on`.
fn pool_of(job: &Job) -> Option<String> {
    (!job.run_on.is_empty()).then(|| job.run_on.id())
}

/// What `check` and `plan` print after a job's shard when it has a pool, fans out or is in a
/// group: nothing for a job that runs anywhere in no group, so their lines read as before.
fn placement(job: &Job) -> String {
    let pool = pool_of(job).map(|pool| format!(" pool={pool}")).unwrap_or_default();
    let fan_out = if job.fan_out == FanOut::All { " fan_out=all" } else { "" };
    let group = job
        .group
        .as_ref()
        .map(|group| format!(" group={}", group.name))
        .unwrap_or_default();
    format!("{pool}{fan_out}{group}")
}

/// `check`'s last line: what the file holds, counted.
fn summary(config: &Config) -> String {
    let pools = match config.elections.pools.len() {
        0 => String::new(),
        count => format!(" and {count} pools of {} shards", config.cluster.pool_shards),
    };
    let groups = match config.groups.len() {
        0 => String::new(),
        1 => ", 1 concurrency group".to_string(),
        count => format!(", {count} concurrency groups"),
    };
    let plural = |count: usize, one: &str| match count {
        0 => String::new(),
        1 => format!(", 1 {one}"),
        count => format!(", {count} {one}s"),
    };
    let named = plural(config.blackouts.len(), "blackout") + &plural(config.notifiers.len(), "notifier");
    format!(
        "{}: ok: {} jobs in {} shards{pools}{groups}{named}, cluster {:?}",
        config.path.display(),
        config.jobs.len(),
        config.cluster.shards,
        config.cluster.name
    )
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
                    shard: job.pool_shard,
                    pool: pool_of(job),
                    fan_out: job.fan_out,
                    group: job.group.as_ref().map(|group| group.name.as_str()),
                    zone: zone.name(),
                    schedule: job.schedule.expanded(),
                    next,
                    blackouts: job.blackouts.iter().map(|b| b.name.as_str()).collect(),
                    notify: job.notify.iter().map(|n| n.name.as_str()).collect(),
                    ping: job.ping.is_some(),
                },
            )?;
            continue;
        }
        writeln!(
            out,
            "{} shard={}{} zone={} next={} schedule=\"{}\"{}",
            job.name,
            job.pool_shard,
            placement(job),
            zone,
            next.as_deref().unwrap_or("never"),
            job.schedule.expanded(),
            telling(job)
        )?;
    }
    if args.json {
        writeln!(out, "{}]", if config.jobs.is_empty() { "" } else { "\n" })?;
    }
    for warning in config.warnings() {
        eprintln!("{}: warning: {warning}", config.path.display());
    }
    let summary = summary(&config);
    // The summary is the command's answer: on stdout after the jobs, where `--json`'s array
    // leaves room for nothing else; warnings and errors stay on stderr.
    match args.json {
        true => eprintln!("{summary}"),
        false => writeln!(out, "{summary}")?,
    }
    out.flush()?;
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

/// One line of `plan` (and of `backfill --dry-run`): the instant in the job's zone, the job, its
/// shard and placement, and the DST rule that decided the instant, if one did.
pub(super) fn write_fire(out: &mut impl Write, fire: &plan::Fire) -> Result<()> {
    let zone = fire.job.schedule.zone();
    write!(
        out,
        "{} {} shard={}{} zone={}",
        format_instant(fire.at, zone),
        fire.job.name,
        fire.job.pool_shard,
        placement(fire.job),
        zone
    )?;
    match fire.note() {
        Some(note) => writeln!(out, " note=\"{note}\"")?,
        None => writeln!(out)?,
    }
    Ok(())
}

pub fn plan(args: &PlanArgs) -> Result<()> {
    let config = args.config.load()?;
    let (from, to) = args.window()?;
    let jobs = args.jobs(&config)?;
    let (fires, cut) = plan::fires(&jobs, from, to, args.limit);
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    if args.json {
        let fires: Vec<plan::PlannedFire> = fires.iter().map(plan::PlannedFire::from).collect();
        serde_json::to_writer_pretty(&mut out, &fires)?;
        writeln!(out)?;
    } else {
        for fire in &fires {
            write_fire(&mut out, fire)?;
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
