//! The runs of this node: starting them with the overlap policy, waiting for them at
//! shutdown, and writing their results to etcd in batches.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::clock;
use crate::config::Overlap;
use crate::keys::Keys;
use crate::ledger::{self, RunRecord};
use crate::runner::{self, Tick};

/// Results are batched for this long, so a burst of runs costs one etcd write.
const RESULT_BATCH_WINDOW: Duration = Duration::from_millis(250);

/// Runs started on this node. Cheap to clone.
#[derive(Clone)]
pub struct Runs {
    tracker: TaskTracker,
    running: Arc<Mutex<HashMap<String, usize>>>,
    /// Cancelled when the shutdown grace is over: running commands are killed.
    kill: CancellationToken,
    results: mpsc::UnboundedSender<(String, RunRecord)>,
}

impl Runs {
    /// Starts the result writer; it ends once every clone of the returned `Runs` is dropped.
    pub fn new(client: etcd_client::Client, keys: Keys) -> (Runs, JoinHandle<()>) {
        let (results, receiver) = mpsc::unbounded_channel();
        let writer = tokio::spawn(write_results(client, keys, receiver));
        let runs = Runs {
            tracker: TaskTracker::new(),
            running: Arc::default(),
            kill: CancellationToken::new(),
            results,
        };
        (runs, writer)
    }

    /// Runs `ticks` of one job one after another (a catch-up runs missed ticks in order), unless
    /// the job's overlap policy says to skip them.
    pub fn start(&self, ticks: Vec<Tick>) {
        let Some(first) = ticks.first() else { return };
        let job = Arc::clone(&first.job);
        {
            let mut running = self.running.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            let count = running.entry(job.name.clone()).or_default();
            if *count > 0 && job.overlap == Overlap::Skip {
                drop(running);
                for tick in ticks {
                    tracing::info!(job = %job.name, tick = %tick.scheduled_at_text(), "skipped: the previous run of this job on this node is still going (overlap = \"skip\")");
                    self.report(&tick, skipped(&tick));
                }
                return;
            }
            *count += 1;
        }
        let runs = self.clone();
        self.tracker.spawn(async move {
            for tick in ticks {
                let record = runner::run(&tick, &runs.kill).await;
                runs.report(&tick, record);
            }
            let mut running = runs.running.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            if let Some(count) = running.get_mut(&job.name) {
                *count = count.saturating_sub(1);
            }
        });
    }

    fn report(&self, tick: &Tick, record: RunRecord) {
        // The writer only stops after every sender is gone, so this cannot fail while we live.
        let _ = self.results.send((tick.job.name.clone(), record));
    }

    /// Waits for running commands up to `grace`, then kills their process groups and waits for
    /// them to exit.
    pub async fn drain(&self, grace: Duration) {
        self.tracker.close();
        if self.tracker.is_empty() {
            return;
        }
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
}

fn skipped(tick: &Tick) -> RunRecord {
    RunRecord {
        scheduled_at: tick.scheduled_at,
        fence: tick.fence,
        node: tick.node.clone(),
        outcome: "skipped".into(),
        exit_code: None,
        duration_ms: 0,
        finished_at: clock::now(),
    }
}

/// Collects results for a short window and writes each job's newest in one transaction.
async fn write_results(
    client: etcd_client::Client,
    keys: Keys,
    mut receiver: mpsc::UnboundedReceiver<(String, RunRecord)>,
) {
    while let Some(first) = receiver.recv().await {
        let mut batch: HashMap<String, RunRecord> = HashMap::new();
        let mut add = |(job, record): (String, RunRecord)| {
            let newer = batch
                .get(&job)
                .is_none_or(|held| held.scheduled_at <= record.scheduled_at);
            if newer {
                batch.insert(job, record);
            }
        };
        add(first);
        let window = tokio::time::sleep(RESULT_BATCH_WINDOW);
        tokio::pin!(window);
        loop {
            tokio::select! {
                _ = &mut window => break,
                next = receiver.recv() => match next {
                    Some(entry) => add(entry),
                    None => break,
                },
            }
        }
        let batch: Vec<(String, RunRecord)> = batch.into_iter().collect();
        if let Err(err) = ledger::record_runs(&client, &keys, &batch).await {
            tracing::warn!(error = %err, runs = batch.len(), "could not record run results in etcd (the runs themselves happened and were logged)");
        }
    }
}
