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
use crate::rules::config::{Config, Job};
use crate::rules::pools::FanOut;
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
            anyhow::bail!(
                "no job {unknown:?} in {}{}",
                config.path.display(),
                super::job_suggestion(config, unknown)
            );
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
    let Some(job) = config.jobs.iter().find(|job| job.name == args.job) else {
        anyhow::bail!(
            "no job {:?} in {}{}",
            args.job,
            config.path.display(),
            super::job_suggestion(&config, &args.job)
        );
    };
    if job.fan_out == FanOut::All {
        return trigger_each(args, &config, job);
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

/// `trigger` of a `fan_out = "all"` job: a run on every live node with its tags, each with its
/// own fence. With `--wait`, the exit status is 0 if every run exited 0, else the first
/// failure's (by node id).
fn trigger_each(args: &TriggerArgs, config: &Config, job: &Job) -> Result<ExitCode> {
    block_on(async {
        let cluster = args.cluster.connect(config).await?;
        let asked = triggers::ask_each(&cluster.client, &cluster.keys, &job.name, &job.run_on, args.timeout)
            .await
            .with_context(|| format!("cannot ask for runs through etcd at {:?}", cluster.endpoints))?;
        if asked.is_empty() {
            anyhow::bail!(
                "{} runs on every node with the tags [{}] (fan_out = \"all\"), and no live node has them all",
                job.name,
                job.run_on.iter().collect::<Vec<_>>().join(", ")
            );
        }
        print(format_args!(
            "{} fans out: asked each of its {} eligible nodes for a run\n",
            job.name,
            asked.len()
        ))?;
        let mut claims = Vec::new();
        let mut not_taken = Vec::new();
        for (node, claimed) in asked {
            match claimed {
                Some(claimed) => {
                    print(format_args!(
                        "triggered {} node={} fence={}\n",
                        job.name, claimed.node, claimed.fence
                    ))?;
                    claims.push(claimed);
                }
                None => {
                    eprintln!(
                        "shardcron: node {node} did not take the run of {} within {:?}; its request was withdrawn",
                        job.name, args.timeout
                    );
                    not_taken.push(node);
                }
            }
        }
        let mut status = if not_taken.is_empty() {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        };
        for claimed in &claims {
            if !args.wait {
                triggers::forget(&cluster.client, &cluster.keys, &claimed.id).await?;
                continue;
            }
            let run = triggers::wait_for_run(&cluster.client, &cluster.keys, claimed)
                .await
                .with_context(|| format!("cannot follow the runs through etcd at {:?}", cluster.endpoints))?;
            let failed = match run {
                Some(run) if run.outcome == Outcome::Exited && run.exit_code == Some(0) => None,
                Some(run) => {
                    eprintln!(
                        "shardcron: the run of {} on {} ended: {} (exit {:?})",
                        job.name, claimed.node, run.outcome, run.exit_code
                    );
                    Some(match (run.outcome, run.exit_code) {
                        (Outcome::Exited, Some(code)) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
                        _ => ExitCode::FAILURE,
                    })
                }
                None => {
                    eprintln!(
                        "shardcron: node {} left the fleet and did not report the end of the run within {:?}",
                        claimed.node,
                        triggers::AFTER_THE_NODE_LEFT
                    );
                    Some(ExitCode::FAILURE)
                }
            };
            if let (Some(failed), true) = (failed, status == ExitCode::SUCCESS) {
                status = failed;
            }
        }
        Ok(status)
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
                anyhow::bail!(
                    "no job {name:?} in {}, and no pause of one{}",
                    config.path.display(),
                    super::job_suggestion(&config, name)
                );
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
