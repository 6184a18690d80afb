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
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

mod sessions;
mod tasks;

use crate::backoff::Backoff;
use crate::context::NodeContext;
use crate::coord::activity::ActivityCount;
use crate::coord::backfills::Backfills;
use crate::coord::claims::ClaimLead;
use crate::coord::election;
use crate::coord::groups::Groups;
use crate::coord::keys::{ElectionKeys, Keys};
use crate::coord::pauses::Pauses;
use crate::coord::results::{write_leftovers, ResultQueue};
use crate::readiness::Readiness;
use crate::rules::config::Config;
use crate::rules::config::{Loaded, NodeSpec};
use crate::rules::pools::Tags;
use crate::running::backfill_settles::BackfillSettles;
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
    let keys = Keys::new(&config.cluster.name);
    let results = Arc::new(ResultQueue::new(config.cluster.history));
    let results_closed = CancellationToken::new();
    let result_writer = tokio::spawn(write_leftovers(
        Arc::clone(&results),
        client.clone(),
        keys.clone(),
        results_closed.clone(),
    ));
    let job_count = config.jobs.len();
    let cluster = config.cluster.clone();
    let etcd = config.etcd.clone();
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
    let pauses = Arc::new(Pauses::default());
    // A group's limit as the config holds it now: a reload that lowers it holds for the slots
    // already held, not only for new takes.
    let configured = loaded.clone();
    let limits: crate::coord::groups::CurrentLimit =
        Box::new(move |group| configured.borrow().groups.get(group).map(|group| group.limit));
    let groups = Arc::new(Groups::new(client.clone(), keys.clone(), cluster.lease_ttl, limits));
    let backfills = Arc::new(Backfills::default());
    let (outbox, notifications, notes) =
        crate::running::notifications::new(client.clone(), keys.clone(), options.node_id.clone());
    // Closed only once the runs drained: a run that ends in the grace is told and pinged too.
    let notes_closed = CancellationToken::new();
    let notifier = tokio::spawn(Arc::clone(&notifications).run(notes, notes_closed.clone(), options.hurry.clone()));
    // Runs and the writes that settle their backfill ticks are followed together, so the
    // shutdown's drain waits for both.
    let run_tracker = TaskTracker::new();
    let settles = Arc::new(BackfillSettles::new(
        client.clone(),
        keys.clone(),
        Arc::clone(&backfills),
        run_tracker.clone(),
    ));
    let activity = Arc::new(ActivityCount::default());
    // Every finished run passes each of these, in this order (`running::report`).
    let reports = Reports::new(vec![
        Arc::new(crate::metrics::get()),
        Arc::clone(&activity) as Arc<dyn RunSink>,
        Arc::new(outbox),
        Arc::new(crate::coord::job_gauges::get()),
        Arc::clone(&results) as Arc<dyn RunSink>,
        Arc::clone(&settles) as Arc<dyn RunSink>,
    ]);
    let node = Arc::new(NodeContext {
        node_id: options.node_id.clone(),
        keys,
        tags: options.tags.clone(),
        etcd_member: options.etcd_member.clone(),
        election_keys,
        jobs: loaded,
        runs: Runs::new(
            run_tracker,
            reports.clone(),
            settles,
            Arc::clone(&pauses),
            Arc::clone(&groups),
            Arc::clone(&options.child_env),
        ),
        reports,
        activity,
        pauses,
        groups,
        triggers: Arc::default(),
        backfills,
        results,
        notifications,
        claim_lead: ClaimLead::new(),
        started_here: Arc::default(),
        elections: election::Admission::new(ELECTION_REQUESTS),
        shutdown: shutdown.clone(),
    });
    tasks::spawn_node_tasks(&node, &options, &client, &etcd);
    tracing::info!(
        node = %node.node_id,
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

    tracing::info!("shutting down: shards resigned; waiting for running commands");
    node.runs.drain(options.shutdown_grace, &options.hurry).await;
    node.groups.close().await;
    results_closed.cancel();
    notes_closed.cancel();
    if let Err(err) = result_writer.await {
        tracing::warn!(error = %err, "result writer ended abnormally");
    }
    if let Err(err) = notifier.await {
        tracing::warn!(error = %err, "notification sender ended abnormally");
    }
    tracing::info!("node stopped");
}
