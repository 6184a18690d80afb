//! A node: one session at a time, a campaign per shard, a term per led shard.
//!
//! Cancellation is a tree: `shutdown` (signals) → the session's token (lease lost) → each term's
//! leadership. When the session is lost every term ends at once and the node opens a new session
//! after a capped, jittered backoff. On shutdown the node stops claiming, revokes its lease
//! (which resigns every shard at once), gives running commands their grace period, then writes
//! the results still waiting and tells what the last runs told (for at most
//! [`crate::running::notifications::FLUSH`]).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

mod sessions;
mod tasks;

use crate::backoff::Backoff;
use crate::context::{Etcd, Identity, Mirrors, NodeContext, Work};
use crate::coord::activity::ActivityCount;
use crate::coord::backfills::Backfills;
use crate::coord::claims::ClaimLead;
use crate::coord::election;
use crate::coord::groups::{CurrentLimit, Groups};
use crate::coord::job_gauges::JobGauges;
use crate::coord::keys::{ElectionKeys, Keys};
use crate::coord::pauses::Pauses;
use crate::coord::results::{write_leftovers, ResultQueue};
use crate::readiness::Readiness;
use crate::rules::config::Config;
use crate::rules::config::{Loaded, NodeSpec};
use crate::rules::pools::Tags;
use crate::running::backfill_settles::BackfillSettles;
use crate::running::notifications::{Notifications, Outbox};
use crate::running::report::{Reports, RunSink};
use crate::running::runs::Runs;
use crate::serving::http::{Exposed, Exposure};
use sessions::Sessions;

/// At most this many election requests of single shards in flight per node.
const ELECTION_REQUESTS: usize = 8;

/// How a node runs, beyond what `jobs.toml` says.
#[derive(Debug, Clone)]
pub struct NodeOptions {
    pub node_id: String,
    /// `--tags`: which pools the node campaigns in.
    pub tags: Tags,
    pub shutdown_grace: Duration,
    /// Cancelled by a second signal: running commands are killed at once instead of being given
    /// the rest of their grace.
    pub hurry: CancellationToken,
    /// Moved along as the node connects, campaigns, loses its session and stops.
    pub readiness: Readiness,
    /// Filled once the node runs, for the HTTP API.
    pub exposure: Exposure,
    /// The environment every command starts from: the node's own without its secrets.
    pub child_env: Arc<crate::secrets::ChildEnv>,
    /// The etcd member the node's calls go to first, as it changes (scheme, host and port).
    pub etcd_member: watch::Receiver<Option<String>>,
}

/// Runs the node until `shutdown` is cancelled. Coordination failures are retried forever; only
/// a shutdown ends this. Each validated config on `reloads` with the same `[cluster]` and
/// `[etcd]` replaces the jobs at the next quiet moment of every term, without giving up a shard.
pub async fn run(
    config: Config,
    options: NodeOptions,
    client: etcd_client::Client,
    shutdown: CancellationToken,
    reloads: mpsc::UnboundedReceiver<Config>,
) {
    let job_count = config.jobs.len();
    let (cluster, etcd) = (config.cluster.clone(), config.etcd.clone());
    let Built {
        node,
        loaded_sender,
        writers,
    } = build(config, &options, &client, shutdown);
    tasks::spawn_node_tasks(&node, &options, &client, &etcd);
    tracing::info!(
        node = %node.identity.node_id,
        cluster = %cluster.name,
        shards = cluster.shards,
        tags = %options.tags.iter().collect::<Vec<_>>().join(","),
        jobs = job_count,
        lease_ttl = ?cluster.lease_ttl,
        "node starting"
    );
    let sessions = Sessions {
        node: Arc::clone(&node),
        client,
        cluster,
        etcd,
        readiness: options.readiness.clone(),
        started_at: crate::clock::now(),
        backoff: Backoff::coordination(),
        unrevoked: Vec::new(),
    };
    sessions.run(reloads, loaded_sender).await;
    writers.shut_down(&node, &options).await;
}

/// A node's parts, built before its first session, and the writers its shutdown ends last.
struct Built {
    node: Arc<NodeContext>,
    /// Where a reload's jobs go, for the sessions to send.
    loaded_sender: watch::Sender<Arc<Loaded>>,
    writers: Writers,
}

/// The two tasks that write out what runs leave behind (their results, their notifications),
/// with the tokens that close them: only once the runs drained, so a run that ends in the grace
/// is recorded and told too.
struct Writers {
    results_closed: CancellationToken,
    result_writer: JoinHandle<()>,
    notes_closed: CancellationToken,
    notifier: JoinHandle<()>,
}

/// Builds the node's parts from its config, in this order: the results queue and its writer
/// (spawned), the jobs as loaded (exposed to the HTTP API), pauses, groups, backfills, the
/// notifications and their sender (spawned), the runs with the sinks every finished run passes,
/// and the [`NodeContext`] that holds them.
fn build(config: Config, options: &NodeOptions, client: &etcd_client::Client, shutdown: CancellationToken) -> Built {
    let keys = Keys::new(&config.cluster.name);
    let (results, results_closed, result_writer) = spawn_result_writer(config.cluster.history, client, &keys);
    let lease_ttl = config.cluster.lease_ttl;
    let election_keys = ElectionKeys {
        keys: keys.clone(),
        elections: Arc::clone(&config.elections),
        node: options.node_id.clone(),
    };
    let spec = NodeSpec {
        id: options.node_id.clone(),
        tags: options.tags.clone(),
    };
    let (loaded_sender, loaded) = watch::channel(Arc::new(Loaded::new(config, &spec)));
    options.exposure.fill(Exposed {
        client: client.clone(),
        jobs: loaded.clone(),
    });
    let mirrors = Arc::new(Mirrors {
        pauses: Arc::new(Pauses::default()),
        groups: Arc::new(Groups::new(
            client.clone(),
            keys.clone(),
            lease_ttl,
            current_limits(&loaded),
        )),
        triggers: Arc::default(),
        backfills: Arc::new(Backfills::default()),
    });
    let (outbox, notifications, notes_closed, notifier) = spawn_notifier(client, &keys, options);
    let work = build_work(client, &keys, &mirrors, outbox, notifications, results, options);
    let node = Arc::new(NodeContext {
        identity: Arc::new(Identity {
            node_id: options.node_id.clone(),
            keys,
            tags: options.tags.clone(),
            election_keys,
        }),
        mirrors,
        work: Arc::new(work),
        etcd: Etcd {
            etcd_member: options.etcd_member.clone(),
            elections: election::ElectionThrottle::new(ELECTION_REQUESTS),
        },
        jobs: loaded,
        shutdown,
    });
    Built {
        node,
        loaded_sender,
        writers: Writers {
            results_closed,
            result_writer,
            notes_closed,
            notifier,
        },
    }
}

/// The node's runs and where their ends go: the report path's sinks, in their order.
fn build_work(
    client: &etcd_client::Client,
    keys: &Keys,
    mirrors: &Mirrors,
    outbox: Outbox,
    notifications: Arc<crate::running::notifications::Notifications>,
    results: Arc<ResultQueue>,
    options: &NodeOptions,
) -> Work {
    // Runs and the writes that settle their backfill ticks are followed together, so the
    // shutdown's drain waits for both.
    let run_tracker = TaskTracker::new();
    let settles = Arc::new(BackfillSettles::new(
        client.clone(),
        keys.clone(),
        Arc::clone(&mirrors.backfills),
        run_tracker.clone(),
    ));
    let activity = Arc::new(ActivityCount::default());
    let job_gauges = JobGauges::exported();
    let reports = report_sinks(&activity, outbox, &job_gauges, &results, &settles);
    Work {
        runs: Runs::new(
            run_tracker,
            reports.clone(),
            settles,
            Arc::clone(&mirrors.pauses),
            Arc::clone(&mirrors.groups),
            Arc::clone(&options.child_env),
        ),
        reports,
        results,
        notifications,
        activity,
        job_gauges,
        started_here: Arc::default(),
        claim_lead: ClaimLead::new(),
    }
}

/// The queue of results waiting to be written to etcd (keeping `history` runs a job), and its
/// writer, spawned; the writer ends once the token is cancelled and the queue written out.
fn spawn_result_writer(
    history: u32,
    client: &etcd_client::Client,
    keys: &Keys,
) -> (Arc<ResultQueue>, CancellationToken, JoinHandle<()>) {
    let results = Arc::new(ResultQueue::new(history));
    let closed = CancellationToken::new();
    let writer = tokio::spawn(write_leftovers(
        Arc::clone(&results),
        client.clone(),
        keys.clone(),
        closed.clone(),
    ));
    (results, closed, writer)
}

/// The outbox runs hand their notifications to, and their sender, spawned; the sender ends once
/// the token is cancelled and what waits is told (sooner on a second signal).
fn spawn_notifier(
    client: &etcd_client::Client,
    keys: &Keys,
    options: &NodeOptions,
) -> (Outbox, Arc<Notifications>, CancellationToken, JoinHandle<()>) {
    let (outbox, notifications, notes) =
        crate::running::notifications::new(client.clone(), keys.clone(), options.node_id.clone());
    // Closed only once the runs drained: a run that ends in the grace is told and pinged too.
    let closed = CancellationToken::new();
    let notifier = tokio::spawn(Arc::clone(&notifications).run(notes, closed.clone(), options.hurry.clone()));
    (outbox, notifications, closed, notifier)
}

/// A group's limit as the config holds it now: a reload that lowers it holds for the slots
/// already held, not only for new takes.
fn current_limits(loaded: &watch::Receiver<Arc<Loaded>>) -> CurrentLimit {
    let configured = loaded.clone();
    Box::new(move |group| configured.borrow().groups.get(group).map(|group| group.limit))
}

/// Every finished run passes each of these, in this order (`running::report`).
fn report_sinks(
    activity: &Arc<ActivityCount>,
    outbox: Outbox,
    job_gauges: &Arc<JobGauges>,
    results: &Arc<ResultQueue>,
    settles: &Arc<BackfillSettles>,
) -> Reports {
    Reports::new(vec![
        Arc::new(crate::metrics::get()),
        Arc::clone(activity) as Arc<dyn RunSink>,
        Arc::new(outbox),
        Arc::clone(job_gauges) as Arc<dyn RunSink>,
        Arc::clone(results) as Arc<dyn RunSink>,
        Arc::clone(settles) as Arc<dyn RunSink>,
    ])
}

impl Writers {
    /// The shutdown, once the sessions ended (shards resigned): the runs get their grace, the
    /// groups give back their slots, then the results and notifications still waiting are
    /// written and told.
    async fn shut_down(self, node: &NodeContext, options: &NodeOptions) {
        tracing::info!("shutting down: shards resigned; waiting for running commands");
        node.work.runs.drain(options.shutdown_grace, &options.hurry).await;
        node.mirrors.groups.close().await;
        self.results_closed.cancel();
        self.notes_closed.cancel();
        if let Err(err) = self.result_writer.await {
            tracing::warn!(error = %err, "result writer ended abnormally");
        }
        if let Err(err) = self.notifier.await {
            tracing::warn!(error = %err, "notification sender ended abnormally");
        }
        tracing::info!("node stopped");
    }
}
