//! `trigger`, `pause` and `resume`: asking the fleet through etcd. What can be refused without
//! the cluster (an unknown job, a pause that ends before it starts) is refused before it is
//! reached.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use chrono::{DateTime, Utc};
use clap::Args;

use super::{block_on, parse_instant, print, ClusterArg};
use crate::coord::pauses::{self, Pause, PauseRefused, EVERY_JOB};
use crate::coord::triggers;
use crate::rules::config::Config;
use crate::rules::record::Outcome;

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
    #[arg(long, default_value = "10s", value_parser = crate::rules::bounds::wait)]
    pub timeout: Duration,
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
    #[arg(long = "for", id = "for_", value_name = "DURATION", value_parser = crate::rules::bounds::window)]
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
    pub fn pause(&self, now: DateTime<Utc>) -> Result<Pause> {
        let until = parse_instant("--until", self.until.as_deref())?;
        Pause::asked(now, until, self.for_, self.reason.clone()).map_err(|refused| match refused {
            PauseRefused::EndsBeforeItStarts => {
                anyhow::anyhow!("the pause would end before it starts: --until must be in the future")
            }
            PauseRefused::TooLong => anyhow::anyhow!("--for is too long"),
            PauseRefused::ReasonTooLong => {
                anyhow::anyhow!("--reason is longer than {} bytes", pauses::MAX_REASON)
            }
        })
    }

    /// The names the pause is stored under: the jobs, every one in the config, or
    /// [`EVERY_JOB`] for `--all`.
    fn names(&self, config: &Config) -> Result<Vec<String>> {
        if self.all {
            return Ok(vec![EVERY_JOB.to_string()]);
        }
        if let Some(unknown) = self.jobs.iter().find(|name| !has_job(config, name)) {
            anyhow::bail!("no job {unknown:?} in {}", config.path.display());
        }
        Ok(self.jobs.clone())
    }
}

fn has_job(config: &Config, name: &str) -> bool {
    config.jobs.iter().any(|job| job.name == name)
}

/// How a pause's name is printed: `pause --all`'s as the flag that made it.
fn shown(name: &str) -> &str {
    if name == EVERY_JOB {
        "--all"
    } else {
        name
    }
}

/// `trigger`: the exit status is the run's own with `--wait`.
pub fn trigger(args: &TriggerArgs) -> Result<ExitCode> {
    let config = args.cluster.config.load()?;
    if !has_job(&config, &args.job) {
        anyhow::bail!("no job {:?} in {}", args.job, config.path.display());
    }
    block_on(async {
        let cluster = args.cluster.connect(&config).await?;
        let asked = triggers::ask(&cluster.client, &cluster.keys, &args.job, args.timeout)
            .await
            .with_context(|| format!("cannot ask for a run through etcd at {:?}", cluster.endpoints))?;
        let Some(claimed) = asked else {
            anyhow::bail!(
                "no leader took the run of {} within {:?}; the request was withdrawn (is a node running with this config? see `shardcron status`)",
                args.job,
                args.timeout
            );
        };
        let printed = print(format_args!(
            "triggered {} node={} fence={}\n",
            args.job, claimed.node, claimed.fence
        ));
        if !args.wait || printed.is_err() {
            // The run is asked for either way: its answer is not left behind in etcd.
            triggers::forget(&cluster.client, &cluster.keys, &claimed.id).await?;
            return printed.map(|()| ExitCode::SUCCESS);
        }
        let run = triggers::wait_for_run(&cluster.client, &cluster.keys, &claimed)
            .await
            .with_context(|| format!("cannot follow the run through etcd at {:?}", cluster.endpoints))?;
        let Some(run) = run else {
            anyhow::bail!(
                "node {} left the fleet and did not report the end of the run within {:?}",
                claimed.node,
                triggers::AFTER_THE_NODE_LEFT
            );
        };
        Ok(match (run.outcome, run.exit_code) {
            (Outcome::Exited, Some(code)) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
            (outcome, _) => {
                eprintln!("shardcron: the run of {} ended: {outcome}", args.job);
                ExitCode::FAILURE
            }
        })
    })
}

pub fn pause(args: &PauseArgs) -> Result<()> {
    let config = args.cluster.config.load()?;
    let pause = args.pause(Utc::now())?;
    let names = args.names(&config)?;
    block_on(async {
        let cluster = args.cluster.connect(&config).await?;
        pauses::pause(&cluster.client, &cluster.keys, &names, &pause)
            .await
            .with_context(|| format!("cannot store the pause in etcd at {:?}", cluster.endpoints))
    })?;
    let until = pause.until.map_or_else(
        || "-".to_string(),
        |until| until.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
    );
    for name in &names {
        let name = shown(name);
        match &pause.reason {
            Some(reason) => print(format_args!("paused {name} until={until} reason={reason:?}\n"))?,
            None => print(format_args!("paused {name} until={until}\n"))?,
        }
    }
    Ok(())
}

pub fn resume(args: &ResumeArgs) -> Result<()> {
    let config = args.cluster.config.load()?;
    block_on(async {
        let cluster = args.cluster.connect(&config).await?;
        let now = Utc::now();
        let wanted = (!args.all).then_some(args.jobs.as_slice());
        let ended = pauses::resume(&cluster.client, &cluster.keys, wanted, now)
            .await
            .with_context(|| format!("cannot end the pauses in etcd at {:?}", cluster.endpoints))?;
        for name in &ended {
            print(format_args!("resumed {}\n", shown(name)))?;
        }
        for name in args.jobs.iter().filter(|name| !ended.contains(name)) {
            if !has_job(&config, name) {
                anyhow::bail!("no job {name:?} in {}, and no pause of one", config.path.display());
            }
            eprintln!("shardcron: {name} was not paused");
        }
        if !args.all
            && pauses::in_force(&cluster.client, &cluster.keys, now)
                .await?
                .contains_key(EVERY_JOB)
        {
            eprintln!("shardcron: every job stays paused by `pause --all`; `resume --all` ends it");
        }
        Ok(())
    })
}
