//! A node: one session at a time, a campaign per shard, a term per led shard.
//!
//! Cancellation is a tree: `shutdown` (signals) → the session's token (lease lost) → each term's
//! leadership. When the session is lost every term ends at once and the node opens a new session
//! after a capped, jittered backoff. On shutdown the node stops claiming, revokes its lease
//! (which resigns every shard at once), gives running commands their grace period, then writes
//! the results still waiting.

use std::collections::BTreeSet;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::backoff::{sleep_or_cancel, Backoff};
use crate::claims::ClaimLead;
use crate::config::{Cluster, Config, Etcd};
use crate::context::{Loaded, NodeContext};
use crate::election;
use crate::etcd::CoordError;
use crate::fleet;
use crate::joining;
use crate::keys::Keys;
use crate::leader;
use crate::mirror;
use crate::pauses::Pauses;
use crate::readiness::{Readiness, Stage};
use crate::record::Member;
use crate::results::{write_leftovers, ResultQueue};
use crate::runs::Runs;
use crate::session::Session;
use crate::view::{self, FleetView};

/// At most this many election requests of single shards in flight per node.
const ELECTION_REQUESTS: usize = 8;

/// How a node runs, beyond what `jobs.toml` says.
#[derive(Debug, Clone)]
pub struct NodeOptions {
    pub node_id: String,
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
}

/// What a running node shows its HTTP API: its etcd client and its jobs, once it has them.
#[derive(Clone, Default)]
pub struct Exposure(Arc<OnceLock<Exposed>>);

impl std::fmt::Debug for Exposure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.get().is_some() {
            "Exposure(running)"
        } else {
            "Exposure(not yet)"
        })
    }
}

pub(crate) struct Exposed {
    pub(crate) client: etcd_client::Client,
    /// Changes when a reload replaces the node's jobs.
    pub(crate) jobs: watch::Receiver<Arc<Loaded>>,
}

impl Exposure {
    pub(crate) fn get(&self) -> Option<&Exposed> {
        self.0.get()
    }
}

/// Runs the node until `shutdown` is cancelled. Coordination failures are retried forever; only
/// a shutdown ends this. Each validated config on `reloads` with the same `[cluster]` and
/// `[etcd]` replaces the jobs at the next quiet moment of every term, without giving up a shard.
pub async fn run(
    config: Config,
    options: NodeOptions,
    client: etcd_client::Client,
    shutdown: CancellationToken,
    mut reloads: mpsc::UnboundedReceiver<Config>,
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
    let (loaded_sender, loaded) = watch::channel(Arc::new(Loaded::new(config)));
    let _ = options.exposure.0.set(Exposed {
        client: client.clone(),
        jobs: loaded.clone(),
    });
    let readiness = options.readiness.clone();
    let stopping = {
        let (readiness, shutdown) = (readiness.clone(), shutdown.clone());
        async move {
            shutdown.cancelled().await;
            readiness.set(Stage::Stopping);
        }
    };
    tokio::spawn(stopping);
    tokio::spawn(crate::etcd_space::follow(
        client.clone(),
        etcd.endpoints.clone(),
        readiness.clone(),
        shutdown.clone(),
    ));
    let pauses = Arc::new(Pauses::default());
    let counted = Arc::clone(&pauses);
    crate::metrics::get().count_pauses(move || counted.in_force(crate::clock::now()));
    crate::job_gauges::export();
    let node = Arc::new(NodeContext {
        node_id: options.node_id,
        keys,
        shards: cluster.shards,
        jobs: loaded,
        runs: Runs::new(
            Arc::clone(&results),
            Arc::clone(&pauses),
            Arc::clone(&options.child_env),
        ),
        pauses,
        triggers: Arc::default(),
        results,
        claim_lead: ClaimLead::new(),
        started_here: Arc::default(),
        elections: election::Admission::new(ELECTION_REQUESTS),
        shutdown: shutdown.clone(),
    });
    let killer = {
        let (runs, hurry) = (node.runs.clone(), options.hurry.clone());
        async move {
            hurry.cancelled().await;
            runs.kill_all();
        }
    };
    tokio::spawn(killer);
    let started_at = crate::clock::now();
    tracing::info!(
        node = %node.node_id,
        cluster = %cluster.name,
        shards = cluster.shards,
        jobs = job_count,
        lease_ttl = ?cluster.lease_ttl,
        "node starting"
    );

    let mut backoff = Backoff::coordination();
    // Leases of lost sessions that etcd may still hold: their election keys would lead every
    // shard, with no term behind them, until the lease's TTL ran out again.
    let mut unrevoked: Vec<i64> = Vec::new();
    while !shutdown.is_cancelled() {
        let session = tokio::select! {
            opened = Session::open(&client, cluster.lease_ttl, &shutdown) => opened,
            _ = shutdown.cancelled() => break,
        };
        let session = match session {
            Ok(session) => session,
            Err(err) => {
                let wait = backoff.next_delay();
                readiness.set(Stage::EtcdUnreachable(err.to_string()));
                if err.is_refusal() {
                    tracing::error!(error = %err, retry_in = ?wait, "etcd refused this node's credentials; fix [etcd] username, password_env or tls; retrying");
                } else if err.is_nospace() {
                    // etcd_space warns of the alarm once; no lease is granted until it is disarmed.
                    tracing::debug!(error = %err, retry_in = ?wait, "etcd is out of space: no session can open yet; retrying");
                } else {
                    tracing::warn!(error = %err, retry_in = ?wait, "cannot open an etcd session; retrying");
                }
                sleep_or_cancel(wait, &shutdown).await;
                continue;
            }
        };
        readiness.set(Stage::Campaigning);
        tracing::info!(lease = format!("{:x}", session.lease()), ttl = ?session.ttl(), "session open; campaigning for every shard");
        let mut still_held = Vec::new();
        for lease in unrevoked.drain(..) {
            match crate::session::revoke(&client, lease, crate::etcd::CALL_TIMEOUT).await {
                Ok(()) => tracing::info!(lease = format!("{lease:x}"), "revoked the lease of a lost session"),
                Err(err) => {
                    tracing::warn!(lease = format!("{lease:x}"), error = %err, "cannot revoke the lease of a lost session yet");
                    still_held.push(lease);
                }
            }
        }
        unrevoked = still_held;
        let member = Member {
            version: env!("CARGO_PKG_VERSION").to_string(),
            digest: node.jobs.borrow().digest.clone(),
            shards: cluster.shards,
            started_at,
        };
        // Before any claim: an etcd that takes fewer operations per transaction than a claim
        // writes would refuse every full one.
        if let Err(err) = crate::etcd::learn_txn_limit(&client, &node.keys).await {
            let wait = backoff.next_delay();
            readiness.set(Stage::EtcdUnreachable(err.to_string()));
            tracing::warn!(error = %err, retry_in = ?wait, "cannot learn how many operations etcd takes in a transaction; retrying with a new session");
            close(&session, &mut unrevoked).await;
            sleep_or_cancel(wait, &shutdown).await;
            continue;
        }
        if let Err(err) = fleet::register(&session, &node.keys, &node.node_id, &member).await {
            let wait = backoff.next_delay();
            readiness.set(Stage::EtcdUnreachable(err.to_string()));
            tracing::warn!(error = %err, retry_in = ?wait, "cannot register this node in etcd; retrying with a new session");
            close(&session, &mut unrevoked).await;
            sleep_or_cancel(wait, &shutdown).await;
            continue;
        }
        // Read before any shard is led: a node that starts, or campaigns again, while a job is
        // paused must not run one tick of it.
        let read = tokio::try_join!(
            mirror::load(&client, &node.keys, node.pauses.as_ref()),
            mirror::load(&client, &node.keys, node.triggers.as_ref()),
        );
        let (pauses_read, triggers_read) = match read {
            Ok(revisions) => revisions,
            Err(err) => {
                let wait = backoff.next_delay();
                readiness.set(Stage::EtcdUnreachable(err.to_string()));
                tracing::warn!(error = %err, retry_in = ?wait, "cannot read the pauses and run requests; retrying with a new session");
                close(&session, &mut unrevoked).await;
                sleep_or_cancel(wait, &shutdown).await;
                continue;
            }
        };
        let mut tasks = JoinSet::new();
        let view = fleet::spawn_tasks(&mut tasks, &session, &node.keys, node.shards);
        tasks.spawn(register_reloads(Arc::clone(&node), session.clone(), member));
        tasks.spawn(warn_on_drift(Arc::clone(&node), session.clone(), view.clone()));
        let entered = tokio::select! {
            entered = joining::enter_elections(&session, &node.keys, cluster.shards, &node.node_id, view.clone()) => entered,
            _ = session.ended().cancelled() => Err(CoordError::Protocol("the session ended".into())),
        };
        let candidacies = match entered {
            Ok(candidacies) => candidacies,
            Err(err) => {
                let wait = backoff.next_delay();
                readiness.set(Stage::EtcdUnreachable(err.to_string()));
                tracing::warn!(error = %err, retry_in = ?wait, "cannot enter the shard elections; retrying with a new session");
                close(&session, &mut unrevoked).await;
                sleep_or_cancel(wait, &shutdown).await;
                continue;
            }
        };
        readiness.set(Stage::Ready);
        // A session that got this far succeeded: the next loss starts from the shortest delay,
        // not from where the outages before it left the backoff.
        backoff.reset();
        tasks.spawn(mirror::keep(
            session.clone(),
            node.keys.clone(),
            Arc::clone(&node.pauses),
            pauses_read,
        ));
        tasks.spawn(mirror::keep(
            session.clone(),
            node.keys.clone(),
            Arc::clone(&node.triggers),
            triggers_read,
        ));
        if let Some(every) = etcd.compaction {
            tasks.spawn(crate::etcd_space::compact(
                session.clone(),
                node.keys.clone(),
                node.node_id.clone(),
                every,
                view.clone(),
            ));
        }
        for candidacy in candidacies {
            tasks.spawn(leader::run_shard(
                Arc::clone(&node),
                session.clone(),
                view.clone(),
                candidacy,
            ));
        }
        loop {
            tokio::select! {
                _ = session.ended().cancelled() => break,
                Some(config) = reloads.recv() => apply_reload(config, &cluster, &etcd, &loaded_sender),
            }
        }
        readiness.set(Stage::SessionLost);
        // Every task ends with the session's token; waiting for them guarantees no claim is in
        // flight when the lease is revoked.
        while tasks.join_next().await.is_some() {}
        close(&session, &mut unrevoked).await;
        if !shutdown.is_cancelled() {
            let wait = backoff.next_delay();
            tracing::warn!(retry_in = ?wait, "campaigning again with a new session after a backoff");
            sleep_or_cancel(wait, &shutdown).await;
        } else {
            backoff.reset();
        }
    }

    tracing::info!("shutting down: shards resigned; waiting for running commands");
    node.runs.drain(options.shutdown_grace, &options.hurry).await;
    results_closed.cancel();
    if let Err(err) = result_writer.await {
        tracing::warn!(error = %err, "result writer ended abnormally");
    }
    tracing::info!("node stopped");
}

/// Ends `session`, revoking its lease; a lease etcd could not be told about is kept in
/// `unrevoked`, to revoke once etcd answers.
async fn close(session: &Session, unrevoked: &mut Vec<i64>) {
    if !session.close().await {
        unrevoked.push(session.lease());
    }
}

/// Swaps in a reloaded config's jobs. A changed `[cluster]` (jobs sharded for another count) or
/// `[etcd]` (the client is already connected) needs a restart; the old config keeps running.
fn apply_reload(config: Config, cluster: &Cluster, etcd: &Etcd, loaded: &watch::Sender<Arc<Loaded>>) {
    if config.cluster != *cluster || config.etcd != *etcd {
        tracing::error!(config = %config.path.display(), "reload refused: the [cluster] or [etcd] section changed; restart the node to apply it (the old jobs keep running)");
        return;
    }
    // The same file changes nothing: a reload would only end every term of the node between
    // its ticks for no reason.
    if config.digest == loaded.borrow().digest {
        tracing::info!(digest = %config.digest, "reloaded jobs.toml: unchanged, nothing to do");
        return;
    }
    tracing::info!(jobs = config.jobs.len(), digest = %config.digest, "reloaded jobs.toml: terms take the new jobs between ticks, keeping their shards");
    loaded.send_replace(Arc::new(Loaded::new(config)));
}

/// Logs each member whose jobs.toml differs from this node's, once per digest.
async fn warn_on_drift(node: Arc<NodeContext>, session: Session, mut view: watch::Receiver<FleetView>) {
    let mut loaded = node.jobs.clone();
    let mut reported = BTreeSet::new();
    loop {
        {
            let digest = loaded.borrow_and_update().digest.clone();
            let current = view.borrow_and_update();
            let drifted = view::drifted(&current, &digest);
            crate::metrics::get().config_drift_nodes.set(drifted.len() as i64);
            for (id, member) in drifted {
                if reported.insert((id.to_string(), member.digest.clone(), digest.clone())) {
                    tracing::warn!(node = %node.node_id, other = id, its_digest = %member.digest, our_digest = %digest, its_shards = member.shards, "config drift: this member runs a different jobs.toml");
                }
            }
        }
        tokio::select! {
            changed = view.changed() => if changed.is_err() { return },
            changed = loaded.changed() => if changed.is_err() { return },
            _ = session.ended().cancelled() => return,
        }
    }
}

/// Registers this node again with the new digest whenever a reload changes the jobs.
async fn register_reloads(node: Arc<NodeContext>, session: Session, mut member: Member) {
    let mut loaded = node.jobs.clone();
    loop {
        tokio::select! {
            changed = loaded.changed() => if changed.is_err() { return },
            _ = session.ended().cancelled() => return,
        }
        member.digest = loaded.borrow_and_update().digest.clone();
        if let Err(err) = fleet::register(&session, &node.keys, &node.node_id, &member).await {
            tracing::warn!(error = %err, "cannot update this node's registration after a reload; others see the old digest until the next session");
        }
    }
}
