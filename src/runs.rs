//! The runs of this node: starting them with the overlap policy, waiting for them at
//! shutdown, and handing their results to the [`crate::results`] queue.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::clock;
use crate::config::Overlap;
use crate::keys::Keys;
use crate::ledger::RunRecord;
use crate::results::{write_leftovers, ResultQueue};
use crate::runner::{self, Tick};

/// Runs started on this node. Cheap to clone.
#[derive(Clone)]
pub struct Runs {
    tracker: TaskTracker,
    jobs: Arc<Mutex<HashMap<String, JobRuns>>>,
    /// Cancelled when the shutdown grace is over: running commands are killed.
    kill: CancellationToken,
    results: Arc<ResultQueue>,
    results_closed: CancellationToken,
}

/// One job's runs on this node.
#[derive(Default)]
struct JobRuns {
    /// Sequences started or waiting; the entry is dropped at zero.
    pending: usize,
    /// When the run going now started, by the wall clock.
    running_since: Option<DateTime<Utc>>,
    /// Held by the running sequence: a `skip` or `replace` job runs one tick at a time, in order.
    turn: Arc<tokio::sync::Mutex<()>>,
    /// Cancelled to stop the running sequence of a `replace` job.
    replace: CancellationToken,
}

impl Runs {
    /// Starts the writer of results that no claim carries; it ends after [`Runs::drain`].
    pub fn new(client: etcd_client::Client, keys: Keys) -> (Runs, JoinHandle<()>) {
        let results = Arc::new(ResultQueue::default());
        let results_closed = CancellationToken::new();
        let writer = tokio::spawn(write_leftovers(
            Arc::clone(&results),
            client,
            keys,
            results_closed.clone(),
        ));
        let runs = Runs {
            tracker: TaskTracker::new(),
            jobs: Arc::default(),
            kill: CancellationToken::new(),
            results,
            results_closed,
        };
        (runs, writer)
    }

    /// Results waiting to be written, for a claim of their shard to carry.
    pub fn results(&self) -> &ResultQueue {
        &self.results
    }

    /// Runs `ticks` of one job one after another (a catch-up runs missed ticks in order).
    ///
    /// With `overlap = "skip"` the ticks are skipped when, at the first one's scheduled time, the
    /// job was already running here from an earlier tick: that is the overlap the policy is for.
    /// A tick fired late (its claim waited on etcd, or a takeover caught it up) may find the
    /// job's previous late run still going without having overlapped anything at its scheduled
    /// time; it waits its turn instead of being skipped. With `"replace"` the running sequence
    /// is stopped and the new ticks run once it has exited.
    pub fn start(&self, ticks: Vec<Tick>) {
        let Some(first) = ticks.first() else { return };
        let job = Arc::clone(&first.job);
        let turn = {
            let mut jobs = self.jobs.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            let runs = jobs.entry(job.name.clone()).or_default();
            match job.overlap {
                Overlap::Skip if runs.running_since.is_some_and(|since| since <= first.scheduled_at) => {
                    drop(jobs);
                    for tick in ticks {
                        tracing::info!(job = %job.name, tick = %tick.scheduled_at_text(), "skipped: the previous run of this job on this node was still going at this tick (overlap = \"skip\")");
                        crate::metrics::get().skipped_overlaps.inc();
                        self.report(&tick, not_run(&tick, "skipped"));
                    }
                    return;
                }
                Overlap::Replace if runs.running_since.is_some() => {
                    tracing::info!(job = %job.name, tick = %first.scheduled_at_text(), "replacing the job's running run with this tick (overlap = \"replace\")");
                    runs.replace.cancel();
                }
                _ => {}
            }
            runs.pending += 1;
            (job.overlap != Overlap::Allow).then(|| Arc::clone(&runs.turn))
        };
        let runs = self.clone();
        self.tracker.spawn(async move {
            let _turn = match &turn {
                Some(turn) => Some(turn.lock().await),
                None => None,
            };
            let replace = runs.take_turn(&job.name, job.overlap);
            for tick in ticks {
                if replace.is_cancelled() {
                    runs.report(&tick, not_run(&tick, "replaced"));
                    continue;
                }
                runs.mark_running(&job.name, Some(clock::now()));
                let stops = runner::Stops {
                    kill: &runs.kill,
                    replace: &replace,
                };
                let record = runner::run(&tick, &stops).await;
                runs.report(&tick, record);
            }
            runs.mark_running(&job.name, None);
            let mut jobs = runs.jobs.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            if let Some(entry) = jobs.get_mut(&job.name) {
                entry.pending = entry.pending.saturating_sub(1);
                if entry.pending == 0 {
                    jobs.remove(&job.name);
                }
            }
        });
    }

    /// Called by a sequence once it holds the job's turn: the token that stops it. A `replace`
    /// sequence that already has a newer one waiting behind it starts out replaced.
    fn take_turn(&self, job: &str, overlap: Overlap) -> CancellationToken {
        let token = CancellationToken::new();
        if overlap != Overlap::Replace {
            return token;
        }
        let mut jobs = self.jobs.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(entry) = jobs.get_mut(job) {
            if entry.pending > 1 {
                token.cancel();
            }
            entry.replace = token.clone();
        }
        token
    }

    fn mark_running(&self, job: &str, since: Option<DateTime<Utc>>) {
        let mut jobs = self.jobs.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(entry) = jobs.get_mut(job) {
            entry.running_since = since;
        }
    }

    fn report(&self, tick: &Tick, record: RunRecord) {
        crate::metrics::get().record_run(&tick.job.name, &record);
        self.results.push(&tick.job.name, tick.job.shard, record);
    }

    /// Waits for running commands up to `grace`, then kills their process groups and waits for
    /// them to exit; then the result writer writes what is left and ends.
    pub async fn drain(&self, grace: Duration) {
        self.tracker.close();
        if !self.tracker.is_empty() {
            tracing::info!(running = self.tracker.len(), grace = ?grace, "waiting for running commands");
            if tokio::time::timeout(grace, self.tracker.wait()).await.is_err() {
                tracing::warn!(
                    running = self.tracker.len(),
                    "shutdown grace is over: killing the remaining commands"
                );
                self.kill.cancel();
                self.tracker.wait().await;
            }
        }
        self.results_closed.cancel();
    }
}

/// The record of a tick that was claimed but not run: `skipped` or `replaced`.
fn not_run(tick: &Tick, outcome: &str) -> RunRecord {
    RunRecord {
        scheduled_at: tick.scheduled_at,
        fence: tick.fence,
        node: tick.node.clone(),
        outcome: outcome.into(),
        exit_code: None,
        duration_ms: 0,
        finished_at: clock::now(),
        attempts: 0,
    }
}
