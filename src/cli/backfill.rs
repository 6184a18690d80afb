//! `backfill`: every tick of a job's schedule in a past range run again through its shard's
//! leader; `--dry-run` prints the ticks, `--cancel` stops the claims of the rest.

use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;

use super::check::write_fire;
use super::{block_on, parse_instant, print, ClusterArg};
use crate::coord::backfills::{self, Asked};
use crate::rules::backfill::{self, Ask, Backfill, DEFAULT_MAX};
use crate::rules::config::{Config, Job};
use crate::rules::pools::FanOut;

/// How often the command reads the backfill's record while it follows it.
const FOLLOW_EVERY: Duration = Duration::from_millis(500);

#[derive(Debug, Args)]
pub struct BackfillArgs {
    #[command(flatten)]
    pub cluster: ClusterArg,
    /// The job whose ticks to run again.
    pub job: String,
    /// The first instant of the range (RFC 3339), included.
    #[arg(long, required_unless_present = "cancel")]
    pub from: Option<String>,
    /// The end of the range (RFC 3339), excluded; at most now.
    #[arg(long, required_unless_present = "cancel")]
    pub to: Option<String>,
    /// Refuse a range of more ticks than this (at most 100000).
    #[arg(long, default_value_t = DEFAULT_MAX)]
    pub max: usize,
    /// How many of the ticks may run at once (1 to 64).
    #[arg(long, default_value_t = 1)]
    pub parallel: u32,
    /// Print the ticks, as `plan` does, and ask for nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Stop the job's backfill: no tick is claimed after this; runs going end as they will.
    #[arg(long, conflicts_with_all = ["from", "to", "dry_run"])]
    pub cancel: bool,
    /// Return once the backfill is asked for, without following its progress.
    #[arg(long)]
    pub detach: bool,
}

fn find_job<'a>(config: &'a Config, name: &str) -> Result<&'a Job> {
    let Some(job) = config.jobs.iter().find(|job| job.name == name) else {
        anyhow::bail!(
            "no job {name:?} in {}{}",
            config.path.display(),
            super::job_suggestion(config, name)
        );
    };
    if job.fan_out == FanOut::All {
        anyhow::bail!(
            "job {name:?} in {} has fan_out = \"all\": backfill runs a job's ticks on one node, and does not run fanned-out jobs",
            config.path.display()
        );
    }
    Ok(job)
}

/// `backfill`: exit 0 once every tick ran (or at once with `--detach`, `--dry-run` or
/// `--cancel`), 1 if the backfill was cancelled before.
pub fn backfill(args: &BackfillArgs) -> Result<ExitCode> {
    let config = args.cluster.config.load()?;
    let job = find_job(&config, &args.job)?;
    if args.cancel {
        return cancel(args, &config);
    }
    let ask = Ask {
        from: parse_instant("--from", args.from.as_deref())?.context("--from is needed")?,
        to: parse_instant("--to", args.to.as_deref())?.context("--to is needed")?,
        max: args.max,
        parallel: args.parallel,
    };
    let now = crate::clock::now();
    let fires = backfill::ticks(job, &ask, now).with_context(|| format!("cannot backfill job {:?}", job.name))?;
    if args.dry_run {
        let stdout = std::io::stdout();
        let mut out = std::io::BufWriter::new(stdout.lock());
        for fire in &fires {
            write_fire(&mut out, fire)?;
        }
        out.flush()?;
        return Ok(ExitCode::SUCCESS);
    }
    let record = Backfill::new(backfill::new_id(), &ask, &fires, now);
    block_on(async {
        let cluster = args.cluster.connect(&config).await?;
        let asked = backfills::ask(&cluster.client, &cluster.keys, &job.name, &record)
            .await
            .with_context(|| format!("cannot ask for the backfill through etcd at {:?}", cluster.endpoints))?;
        if let Asked::Going(going) = asked {
            let (done, total) = going.progress();
            anyhow::bail!(
                "job {:?} has a backfill going ({} to {}, {done}/{total} done): wait for it, or stop it with `shardcron backfill {} --cancel`",
                job.name,
                going.from.to_rfc3339(),
                going.to.to_rfc3339(),
                job.name
            );
        }
        print(format_args!(
            "backfill {} asked: {} ticks from {} to {}, {} at a time (id {})\n",
            job.name,
            record.total,
            ask.from.to_rfc3339(),
            ask.to.to_rfc3339(),
            ask.parallel,
            record.id
        ))?;
        if args.detach {
            return Ok(ExitCode::SUCCESS);
        }
        follow(&cluster.client, &cluster.keys, &job.name, &record.id).await
    })
}

fn cancel(args: &BackfillArgs, config: &Config) -> Result<ExitCode> {
    block_on(async {
        let cluster = args.cluster.connect(config).await?;
        let cancelled = backfills::cancel(&cluster.client, &cluster.keys, &args.job)
            .await
            .with_context(|| format!("cannot cancel the backfill through etcd at {:?}", cluster.endpoints))?;
        let Some(cancelled) = cancelled else {
            anyhow::bail!("job {:?} has no backfill", args.job);
        };
        let (done, total) = cancelled.progress();
        print(format_args!(
            "backfill {} cancelled: {done}/{total} done, {} still running\n",
            args.job,
            cancelled.in_flight.len()
        ))?;
        Ok(ExitCode::SUCCESS)
    })
}

/// Follows the backfill `id` of `job` until it is over, showing done / total (a bar on a
/// terminal, a line per change otherwise).
async fn follow(
    client: &etcd_client::Client,
    keys: &crate::coord::keys::Keys,
    job: &str,
    id: &str,
) -> Result<ExitCode> {
    let terminal = std::io::stderr().is_terminal();
    let mut shown = None;
    loop {
        let read = backfills::read(client, keys, job)
            .await
            .context("cannot read the backfill's progress")?;
        let Some((backfill, _)) = read.filter(|(backfill, _)| backfill.id == id) else {
            anyhow::bail!("the backfill of {job:?} was replaced by another one");
        };
        let progress = backfill.progress();
        if shown != Some(progress) {
            shown = Some(progress);
            let line = progress_line(job, &backfill, terminal);
            let mut err = std::io::stderr().lock();
            if terminal {
                write!(err, "\r{line}")?;
            } else {
                writeln!(err, "{line}")?;
            }
            err.flush()?;
        }
        if backfill.is_over() {
            if terminal {
                eprintln!();
            }
            let (done, total) = progress;
            if backfill.lost > 0 {
                eprintln!(
                    "shardcron: {} of the ticks were recorded lost: they were running on a node that went (delivery = \"at-most-once\")",
                    backfill.lost
                );
            }
            if backfill.cancelled && done < total {
                eprintln!("shardcron: the backfill of {job} was cancelled: {done}/{total} done");
                return Ok(ExitCode::FAILURE);
            }
            return Ok(ExitCode::SUCCESS);
        }
        tokio::time::sleep(FOLLOW_EVERY).await;
    }
}

/// `report [########------------] 8/20 done, 1 running`, without the bar off a terminal.
fn progress_line(job: &str, backfill: &Backfill, terminal: bool) -> String {
    const WIDTH: usize = 30;
    let (done, total) = backfill.progress();
    let running = backfill.in_flight.len();
    if !terminal {
        return format!("backfill {job}: {done}/{total} done, {running} running");
    }
    // Saturating: the record comes from etcd.
    let filled = (done.min(total).saturating_mul(WIDTH))
        .checked_div(total)
        .unwrap_or(WIDTH);
    format!(
        "backfill {job} [{}{}] {done}/{total} done, {running} running",
        "#".repeat(filled),
        "-".repeat(WIDTH - filled)
    )
}

#[cfg(test)]
mod tests {
    use super::progress_line;
    use crate::rules::backfill::{ticks, Ask, Backfill};
    use crate::rules::config::Job;

    #[test]
    fn the_bar_fills_with_the_ticks_done() {
        let job = Job::for_tests("report", "* * * * *");
        let at = |minute: i64| chrono::DateTime::from_timestamp(1_800_000_000 + minute * 60, 0).unwrap_or_default();
        let ask = Ask {
            from: at(0),
            to: at(4),
            max: 10,
            parallel: 1,
        };
        let fires = ticks(&job, &ask, at(10)).expect("ticks");
        let mut backfill = Backfill::new("b".into(), &ask, &fires, at(10));
        let next = backfill.next_claim(&job).expect("a tick");
        backfill.claim(next, "a", 1, "c1", None);
        backfill.finish(next.tick, "c1");
        assert_eq!(
            progress_line("report", &backfill, true),
            "backfill report [#######-----------------------] 1/4 done, 0 running"
        );
        assert_eq!(
            progress_line("report", &backfill, false),
            "backfill report: 1/4 done, 0 running"
        );
        backfill.done = usize::MAX;
        assert!(
            progress_line("report", &backfill, true).contains(&"#".repeat(30)),
            "a record from etcd counting more than its total fills the bar, no panic"
        );
    }
}
