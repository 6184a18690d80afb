//! The node's sessions, one at a time: open one, prepare it (leases of lost sessions revoked,
//! etcd's transaction limit learned, the node registered, pauses and run requests read, every
//! election entered), lead until it ends, then close it and open the next after a backoff.

use std::sync::Arc;

use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

use super::tasks::{self, Mirrored};
use crate::backoff::{sleep_or_cancel, Backoff};
use crate::context::NodeContext;
use crate::coord::etcd::CoordError;
use crate::coord::fleet;
use crate::coord::joining;
use crate::coord::mirror;
use crate::coord::session::Session;
use crate::readiness::{Readiness, Stage};
use crate::rules::config::{Cluster, Config, Etcd};
use crate::rules::config::{Loaded, NodeSpec};
use crate::rules::record::Member;

/// What the session loop keeps from one session to the next.
pub(super) struct Sessions {
    pub(super) node: Arc<NodeContext>,
    pub(super) client: etcd_client::Client,
    pub(super) cluster: Cluster,
    pub(super) etcd: Etcd,
    pub(super) readiness: Readiness,
    pub(super) started_at: chrono::DateTime<chrono::Utc>,
    pub(super) backoff: Backoff,
    /// Leases of lost sessions that etcd may still hold: their election keys would lead every
    /// shard, with no term behind them, until the lease's TTL ran out again.
    pub(super) unrevoked: Vec<i64>,
}

/// A step of preparing a session that failed: the session is closed and a new one opened after
/// a backoff.
struct Unprepared {
    /// What could not be done, as the log says it.
    what: &'static str,
    err: CoordError,
}

/// What a prepared session starts its leadership with.
struct Prepared {
    tasks: JoinSet<()>,
    view: watch::Receiver<crate::coord::view::FleetView>,
    mirrored: Mirrored,
    candidacies: Vec<crate::coord::election::Leadership>,
}

impl Sessions {
    /// Opens sessions until the node's shutdown, applying each reload to the node's jobs.
    pub(super) async fn run(
        mut self,
        mut reloads: mpsc::UnboundedReceiver<Config>,
        loaded: watch::Sender<Arc<Loaded>>,
    ) {
        let shutdown = self.node.shutdown.clone();
        while !shutdown.is_cancelled() {
            let session = tokio::select! {
                opened = Session::open(&self.client, self.cluster.lease_ttl, &shutdown) => opened,
                _ = shutdown.cancelled() => break,
            };
            let session = match session {
                Ok(session) => session,
                Err(err) => {
                    self.not_opened(err).await;
                    continue;
                }
            };
            self.readiness.set(Stage::Campaigning);
            tracing::info!(lease = format!("{:x}", session.lease()), ttl = ?session.ttl(), "session open; campaigning for every shard");
            self.revoke_unrevoked().await;
            let mut prepared = match self.prepare(&session).await {
                Ok(prepared) => prepared,
                Err(Unprepared { what, err }) => {
                    let wait = self.backoff.next_delay();
                    self.readiness.set(Stage::EtcdUnreachable(err.to_string()));
                    tracing::warn!(error = %err, retry_in = ?wait, "{what}; retrying with a new session");
                    close(&session, &mut self.unrevoked).await;
                    sleep_or_cancel(wait, &shutdown).await;
                    continue;
                }
            };
            self.readiness.set(Stage::Ready);
            // A session that got this far succeeded: the next loss starts from the shortest delay,
            // not from where the outages before it left the backoff.
            self.backoff.reset();
            tasks::lead(
                &mut prepared.tasks,
                &self.node,
                &session,
                &prepared.view,
                prepared.mirrored,
                &self.etcd,
                prepared.candidacies,
            );
            loop {
                tokio::select! {
                    _ = session.ended().cancelled() => break,
                    Some(config) = reloads.recv() => apply_reload(config, &self.cluster, &self.etcd, &self.spec(), &loaded),
                }
            }
            self.readiness.set(Stage::SessionLost);
            // Every task ends with the session's token; waiting for them guarantees no claim is in
            // flight when the lease is revoked.
            while prepared.tasks.join_next().await.is_some() {}
            close(&session, &mut self.unrevoked).await;
            if !shutdown.is_cancelled() {
                let wait = self.backoff.next_delay();
                tracing::warn!(retry_in = ?wait, "campaigning again with a new session after a backoff");
                sleep_or_cancel(wait, &shutdown).await;
            } else {
                self.backoff.reset();
            }
        }
    }

    /// A session that could not open: says why, and waits before the next try.
    async fn not_opened(&mut self, err: CoordError) {
        let wait = self.backoff.next_delay();
        self.readiness.set(Stage::EtcdUnreachable(err.to_string()));
        if err.is_refusal() {
            tracing::error!(error = %err, retry_in = ?wait, "etcd refused this node's credentials; fix [etcd] username, password_env or tls; retrying");
        } else if err.is_nospace() {
            // etcd_space warns of the alarm once; no lease is granted until it is disarmed.
            tracing::debug!(error = %err, retry_in = ?wait, "etcd is out of space: no session can open yet; retrying");
        } else {
            tracing::warn!(error = %err, retry_in = ?wait, "cannot open an etcd session; retrying");
        }
        sleep_or_cancel(wait, &self.node.shutdown).await;
    }

    fn spec(&self) -> NodeSpec {
        NodeSpec {
            id: self.node.identity.node_id.clone(),
            tags: self.node.identity.tags.clone(),
        }
    }

    async fn revoke_unrevoked(&mut self) {
        let mut still_held = Vec::new();
        for lease in self.unrevoked.drain(..) {
            match crate::coord::session::revoke(&self.client, lease, crate::coord::etcd::CALL_TIMEOUT).await {
                Ok(()) => tracing::info!(lease = format!("{lease:x}"), "revoked the lease of a lost session"),
                Err(err) => {
                    tracing::warn!(lease = format!("{lease:x}"), error = %err, "cannot revoke the lease of a lost session yet");
                    still_held.push(lease);
                }
            }
        }
        self.unrevoked = still_held;
    }

    /// Everything a session does before it may lead a shard, in order.
    async fn prepare(&self, session: &Session) -> Result<Prepared, Unprepared> {
        let node = &self.node;
        let failed = |what: &'static str| move |err: CoordError| Unprepared { what, err };
        let elections = &node.identity.election_keys.elections;
        let member = Member {
            version: env!("CARGO_PKG_VERSION").to_string(),
            digest: node.jobs.borrow().digest.clone(),
            shards: self.cluster.shards,
            started_at: self.started_at,
            tags: node.identity.tags.clone(),
            pool_shards: elections.pool_shards,
            pools: elections
                .pools_of(&node.identity.tags)
                .map(|pool| pool.id.clone())
                .collect(),
            etcd: node.etcd.etcd_member.borrow().clone(),
        };
        let campaigns: Vec<u32> = (0..elections.total())
            .filter(|number| elections.eligible(*number, &node.identity.tags))
            .collect();
        // Before any claim: an etcd that takes fewer operations per transaction than a claim
        // writes would refuse every full one.
        crate::coord::etcd::learn_txn_limit(&self.client, &node.identity.keys)
            .await
            .map_err(failed("cannot learn how many operations etcd takes in a transaction"))?;
        fleet::register(session, &node.identity.keys, &node.identity.node_id, &member)
            .await
            .map_err(failed("cannot register this node in etcd"))?;
        // Read before any shard is led: a node that starts, or campaigns again, while a job is
        // paused must not run one tick of it.
        let mirrors = node.mirrors.list();
        let revisions = load_all(&mirrors, &self.client, &node.identity.keys)
            .await
            .map_err(failed(
                "cannot read the pauses, run requests, concurrency groups and backfills",
            ))?;
        let mut tasks = JoinSet::new();
        let view = tasks::watch_fleet(&mut tasks, node, session, member);
        let entered = tokio::select! {
            entered = joining::enter_elections(session, &node.identity.election_keys, &campaigns, &node.identity.node_id, view.clone()) => entered,
            _ = session.ended().cancelled() => Err(CoordError::Protocol("the session ended".into())),
        };
        let candidacies = entered.map_err(failed("cannot enter the shard elections"))?;
        Ok(Prepared {
            tasks,
            view,
            mirrored: mirrors.into_iter().zip(revisions).collect(),
            candidacies,
        })
    }
}

/// Ends `session`, revoking its lease; a lease etcd could not be told about is kept in
/// `unrevoked`, to revoke once etcd answers.
async fn close(session: &Session, unrevoked: &mut Vec<i64>) {
    if !session.close().await {
        unrevoked.push(session.lease());
    }
}

/// Swaps in a reloaded config's jobs. A changed `[cluster]` (jobs sharded for another count),
/// `[etcd]` (the client is already connected) or set of pools (the node's elections) needs a
/// restart; the old config keeps running.
fn apply_reload(config: Config, cluster: &Cluster, etcd: &Etcd, node: &NodeSpec, loaded: &watch::Sender<Arc<Loaded>>) {
    if config.cluster != *cluster || config.etcd != *etcd {
        tracing::error!(config = %config.path.display(), "reload refused: the [cluster] or [etcd] section changed; restart the node to apply it (the old jobs keep running)");
        return;
    }
    if config.elections != loaded.borrow().elections {
        tracing::error!(config = %config.path.display(), "reload refused: the pools changed (a run_on set added or removed, or the first or last fan_out = \"all\" job), which changes the node's elections; restart the node to apply it (the old jobs keep running)");
        return;
    }
    // The same file changes nothing: a reload would only end every term of the node between
    // its ticks for no reason.
    if config.digest == loaded.borrow().digest {
        tracing::info!(digest = %config.digest, "reloaded jobs.toml: unchanged, nothing to do");
        return;
    }
    tracing::info!(jobs = config.jobs.len(), digest = %config.digest, "reloaded jobs.toml: terms take the new jobs between ticks, keeping their shards");
    for warning in config.warnings() {
        tracing::warn!(config = %config.path.display(), "{warning}");
    }
    loaded.send_replace(Arc::new(Loaded::new(config, node)));
}

/// Reads every mirror's prefix whole, all at once; the revision each continues from, in the
/// list's order. The first failure ends the others.
async fn load_all(
    mirrors: &[Arc<dyn mirror::AnyMirror>],
    client: &etcd_client::Client,
    keys: &crate::coord::keys::Keys,
) -> Result<Vec<i64>, CoordError> {
    let mut reads = JoinSet::new();
    for (index, mirror) in mirrors.iter().enumerate() {
        let read = Arc::clone(mirror).load_whole(client.clone(), keys.clone());
        reads.spawn(async move { (index, read.await) });
    }
    let mut revisions = vec![0; mirrors.len()];
    while let Some(joined) = reads.join_next().await {
        let (index, read) = joined.map_err(|err| CoordError::Protocol(format!("a mirror's read ended: {err}")))?;
        revisions[index] = read?;
    }
    Ok(revisions)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(jobs: &str) -> Config {
        let text =
            format!("[cluster]\nname = \"c\"\nshards = 4\n\n[etcd]\nendpoints = [\"http://127.0.0.1:2379\"]\n\n{jobs}");
        crate::rules::config::parse(std::path::Path::new("jobs.toml"), &text).expect("a valid config")
    }

    const PLAIN: &str = "[jobs.a]\nschedule = \"* * * * *\"\ncommand = \"true\"\n";

    #[test]
    fn a_reload_that_changes_the_pools_is_refused_and_one_within_them_is_taken() {
        let node = NodeSpec {
            id: "n".into(),
            tags: crate::rules::pools::Tags::parse("db").unwrap_or_default(),
        };
        let first = config(PLAIN);
        let (cluster, etcd) = (first.cluster.clone(), first.etcd.clone());
        let (loaded, _) = watch::channel(Arc::new(Loaded::new(first, &node)));
        let digest = || loaded.borrow().digest.clone();
        let before = digest();

        let pooled = format!("{PLAIN}[jobs.b]\nschedule = \"* * * * *\"\ncommand = \"true\"\nrun_on = [\"db\"]\n");
        apply_reload(config(&pooled), &cluster, &etcd, &node, &loaded);
        assert_eq!(digest(), before, "a new pool changes the node's elections: refused");

        let fanned = format!("{PLAIN}[jobs.b]\nschedule = \"* * * * *\"\ncommand = \"true\"\nfan_out = \"all\"\n");
        apply_reload(config(&fanned), &cluster, &etcd, &node, &loaded);
        assert_eq!(
            digest(),
            before,
            "the first fanned-out job adds the node's own election: refused"
        );

        let more = format!("{PLAIN}[jobs.c]\nschedule = \"@daily\"\ncommand = \"true\"\n");
        apply_reload(config(&more), &cluster, &etcd, &node, &loaded);
        assert_ne!(digest(), before, "a new job in the same elections is taken");
    }
}
