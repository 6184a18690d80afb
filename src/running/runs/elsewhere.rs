//! A job's runs on other nodes, for `overlap = "skip"` and `"replace"`: a tick does not start
//! beside a run of its job that its record lists as going on another node, as long as etcd
//! shows it going (see [`crate::coord::going`]). `skip` waits for it and skips the tick as it
//! does for a run on this node; `replace` asks that node to stop it and starts once it ended.
//! And this node's side: the runs it lists as going, and the stops other nodes ask of it.

use std::time::Duration;

use super::overlap::{overlaps, Running, Skip};
use super::Runs;
use crate::clock;
use crate::coord::going;
use crate::coord::session::Session;
use crate::rules::config::Overlap;
use crate::rules::record::Going;
use crate::running::runner::{self, Tick};

/// How often a tick waiting for another node's run looks whether it still goes.
const LOOK_EVERY: Duration = Duration::from_millis(500);

/// What came of waiting for the runs going on other nodes.
pub(super) enum Cleared {
    /// None goes any more: the ticks start.
    Yes,
    /// The ticks were settled (skipped) or given back (the leadership ended): nothing starts.
    No,
}

impl Runs {
    /// Waits until none of the runs the first of `ticks` lists as going elsewhere still goes,
    /// skipping the ticks as `overlap = "skip"` says, or asking those runs to stop for
    /// `"replace"`.
    pub(super) async fn clear_elsewhere(&self, ticks: &[Tick]) -> Cleared {
        let first = &ticks[0];
        let job = &first.job;
        let mut asked: Vec<&Going> = Vec::new();
        let mut cleared = Cleared::Yes;
        'runs: for run in &first.elsewhere {
            loop {
                // etcd out of reach: still going, as far as this node can tell.
                let client = self.groups.client();
                if going::still_going(client, self.groups.keys(), &job.name, run).await == Some(false) {
                    first.starts.here().ended_elsewhere(&job.name, run.fence);
                    continue 'runs;
                }
                match job.overlap {
                    Overlap::Skip if !first.caught_up && overlaps(running(run), first.scheduled_at, clock::now()) => {
                        let why = Skip::Elsewhere {
                            node: run.node.clone(),
                            previous_tick: run.tick,
                        };
                        self.skip_all(ticks, why);
                        cleared = Cleared::No;
                        break 'runs;
                    }
                    Overlap::Replace if !asked.contains(&run) => {
                        if let Some(lease) = self.groups.lease_now() {
                            let keys = self.groups.keys();
                            match going::ask_to_stop(self.groups.client(), keys, &job.name, run, lease.lease()).await {
                                Ok(()) => {
                                    runner::span(first).in_scope(|| tracing::info!(node = %run.node, previous_tick = %run.tick, "asked the node running this job's previous run to stop it (overlap = \"replace\")"));
                                    asked.push(run);
                                }
                                Err(err) => tracing::debug!(error = %err, "cannot ask for a stop yet"),
                            }
                        }
                    }
                    _ => {}
                }
                tokio::select! {
                    _ = tokio::time::sleep(LOOK_EVERY) => {}
                    _ = first.starts.leading().cancelled() => {
                        for tick in ticks {
                            runner::span(tick).in_scope(|| self.not_starting(tick));
                        }
                        cleared = Cleared::No;
                        break 'runs;
                    }
                }
            }
        }
        for run in asked {
            going::withdraw(self.groups.client(), self.groups.keys(), &job.name, run).await;
        }
        cleared
    }

    /// Lists `tick`'s run as going on this node in the job's records, for other nodes' leaders
    /// to see; for `overlap = "skip"` and `"replace"` jobs that run on more than this node.
    /// Returns the lease it is listed on: once that lapses, other nodes take the run for ended,
    /// so it must be stopped.
    pub(super) fn list_going(&self, tick: &Tick) -> Option<Session> {
        let job = &tick.job;
        if job.overlap == Overlap::Allow || job.instance_of.is_some() || tick.request.is_some() {
            return None;
        }
        let lease = self.groups.lease_now()?;
        let going = Going {
            node: tick.node.clone(),
            tick: tick.scheduled_at,
            fence: tick.fence,
            lease: lease.lease(),
            since: clock::now(),
        };
        tick.starts.here().run_going(&job.name, going);
        Some(lease)
    }

    /// The run listed by [`Runs::list_going`] ended.
    pub(super) fn unlist_going(&self, tick: &Tick) {
        tick.starts.here().run_ended(&tick.job.name, tick.fence);
    }

    /// Another node's leader asks this node to stop its run of `job` with `fence`, to start the
    /// job's next tick (`overlap = "replace"`).
    pub fn stop_asked(&self, job: &str, fence: i64) {
        let mut jobs = self.jobs.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(entry) = jobs.get_mut(job) {
            if entry.running.is_some_and(|running| running.fence == fence) {
                tracing::info!(job, fence, "another node's leader asks for this run to stop, to start the job's next tick (overlap = \"replace\")");
                entry.replace.cancel();
            }
        }
    }
}

/// `run` as this node's overlap rules read a run.
fn running(run: &Going) -> Running {
    Running {
        since: run.since,
        tick: run.tick,
        caught_up: false,
        fence: run.fence,
    }
}
