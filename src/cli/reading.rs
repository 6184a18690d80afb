//! `status` and `history`: what etcd holds about the cluster and a job's runs, printed.

use std::io::Write;

use anyhow::{Context, Result};
use clap::Args;

use super::{block_on, print, ClusterArg};
use crate::{coord::history, serving::status};

#[derive(Debug, Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub cluster: ClusterArg,
    /// Print one JSON document instead of text.
    #[arg(long)]
    pub json: bool,
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
    /// Print a JSON array of run records instead of a table (with each run's kept output:
    /// stdout, stderr, stdout_truncated, stderr_truncated).
    #[arg(long)]
    pub json: bool,
    /// Print each run's kept output (its job's `output_tail`) under its row.
    #[arg(long)]
    pub output: bool,
}

pub fn status(args: &StatusArgs) -> Result<()> {
    let config = args.cluster.config.load()?;
    block_on(async {
        let cluster = args.cluster.connect(&config).await?;
        let jobs: Vec<&crate::rules::config::Job> = config.jobs.iter().map(|job| &**job).collect();
        let context = || format!("cannot read the cluster state from etcd at {:?}", cluster.endpoints);
        let document = status::read_document(
            &config.cluster,
            &config.elections,
            &config.digest,
            &config.groups,
            jobs,
            &cluster.client,
        )
        .await
        .with_context(context)?;
        if args.json {
            // Straight to stdout, each job's entry made as it is written: at 100,000 jobs the
            // document is tens of megabytes.
            let mut out = std::io::BufWriter::new(std::io::stdout().lock());
            serde_json::to_writer_pretty(&mut out, &document)?;
            writeln!(out)?;
            out.flush()?;
        } else {
            print(format_args!("{}", status::render(&document.into_status())))?;
        }
        Ok(())
    })
}

pub fn history(args: &HistoryArgs) -> Result<()> {
    let config = args.cluster.config.load()?;
    anyhow::ensure!(
        config.cluster.history > 0,
        "{} keeps no history ([cluster] history = 0)",
        config.path.display()
    );
    let fans_out = config
        .jobs
        .iter()
        .any(|job| job.name == args.job && job.fan_out == crate::rules::pools::FanOut::All);
    // A history may hold a run past its trim for a moment: show no more than it keeps. A
    // fanned-out job keeps that many per node.
    let count = if fans_out {
        args.count
    } else {
        args.count.min(config.cluster.history as usize)
    };
    let records = block_on(async {
        let cluster = args.cluster.connect(&config).await?;
        // The table alone needs no output: it stays in etcd.
        let with_output = args.output || args.json;
        let read = if fans_out {
            history::read_each(&cluster.client, &cluster.keys, &args.job, count, with_output).await
        } else {
            history::read(&cluster.client, &cluster.keys, &args.job, count, with_output).await
        };
        read.with_context(|| format!("cannot read the history from etcd at {:?}", cluster.endpoints))
    })?;
    if records.is_empty() && !config.jobs.iter().any(|job| job.name == args.job) {
        anyhow::bail!(
            "no job {:?} in {}, and no history of one{}",
            args.job,
            config.path.display(),
            super::job_suggestion(&config, &args.job)
        );
    }
    if args.json {
        print(format_args!("{}\n", serde_json::to_string_pretty(&records)?))
    } else if args.output {
        print(format_args!("{}", history::render_with_output(&records)))
    } else {
        print(format_args!("{}", history::render(&records)))
    }
}
