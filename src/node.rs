//! A node: one session at a time, a campaign per shard, a term per led shard.
//!
//! Cancellation is a tree: `shutdown` (signals) → the session's `lost` token → each term. When
//! the session is lost every term ends at once and the node opens a new session after a capped,
//! jittered backoff. On shutdown the node stops claiming, revokes its lease (which resigns every
//! shard at once), then gives running commands their grace period.

use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::config::{Config, Job};
use crate::election;
use crate::etcd::CoordError;
use crate::fleet::{self, FleetView};
use crate::keys::Keys;
use crate::leader::{ClaimLead, Memory, Term, TermEnd};
use crate::record::Member;
use crate::runs::Runs;
use crate::session::Session;

/// How a node runs, beyond what `jobs.toml` says.
#[derive(Debug, Clone)]
pub struct NodeOptions {
    pub node_id: String,
    pub shutdown_grace: Duration,
}

/// The jobs a node runs, by shard, and the digest of the file they came from. Replaced whole
/// when a reload brings new jobs.
pub struct Loaded {
    pub digest: String,
    pub by_shard: Vec<Vec<Arc<Job>>>,
}

impl Loaded {
    /// The jobs move into their shards: a node with 100,000 jobs holds one copy of each.
    fn new(config: Config) -> Loaded {
        let mut by_shard = vec![Vec::new(); config.cluster.shards as usize];
        for job in config.jobs {
            let shard = job.shard as usize;
            by_shard[shard].push(Arc::new(job));
        }
        Loaded {
            digest: config.digest,
            by_shard,
        }
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
    let (runs, result_writer) = Runs::new(client.clone(), keys.clone());
    let job_count = config.jobs.len();
    let cluster = config.cluster.clone();
    let etcd = config.etcd.clone();
    let (loaded_sender, loaded) = watch::channel(Arc::new(Loaded::new(config)));
    let claim_lead = ClaimLead::new();
    let started_at = crate::clock::now();
    tracing::info!(
        node = %options.node_id,
        cluster = %cluster.name,
        shards = cluster.shards,
        jobs = job_count,
        lease_ttl = ?cluster.lease_ttl,
        "node starting"
    );

    let mut backoff = Backoff::new();
    while !shutdown.is_cancelled() {
        let session = tokio::select! {
            opened = Session::open(&client, cluster.lease_ttl) => opened,
            _ = shutdown.cancelled() => break,
        };
        let session = match session {
            Ok(session) => session,
            Err(err) => {
                let wait = backoff.next_delay();
                if err.is_refusal() {
                    tracing::error!(error = %err, retry_in = ?wait, "etcd refused this node's credentials; fix [etcd] username, password_env or tls; retrying");
                } else {
                    tracing::warn!(error = %err, retry_in = ?wait, "cannot open an etcd session; retrying");
                }
                tokio::select! {
                    _ = tokio::time::sleep(wait) => continue,
                    _ = shutdown.cancelled() => break,
                }
            }
        };
        tracing::info!(lease = format!("{:x}", session.lease()), ttl = ?session.ttl(), "session open; campaigning for every shard");
        let member = Member {
            version: env!("CARGO_PKG_VERSION").to_string(),
            digest: loaded.borrow().digest.clone(),
            shards: cluster.shards,
            started_at,
        };
        if let Err(err) = fleet::register(&session, &keys, &options.node_id, &member).await {
            let wait = backoff.next_delay();
            tracing::warn!(error = %err, retry_in = ?wait, "cannot register this node in etcd; retrying with a new session");
            session.close().await;
            tokio::select! {
                _ = tokio::time::sleep(wait) => continue,
                _ = shutdown.cancelled() => break,
            }
        }
        let (view_sender, view) = watch::channel(FleetView::default());
        let mut shards = JoinSet::new();
        shards.spawn(keep_fleet_view(
            session.clone(),
            keys.clone(),
            cluster.shards,
            view_sender,
            shutdown.clone(),
        ));
        shards.spawn(register_reloads(
            session.clone(),
            keys.clone(),
            options.node_id.clone(),
            member,
            loaded.clone(),
            shutdown.clone(),
        ));
        shards.spawn(warn_on_drift(
            view.clone(),
            loaded.clone(),
            options.node_id.clone(),
            session.clone(),
            shutdown.clone(),
        ));
        for shard in 0..cluster.shards {
            let shard_task = ShardTask {
                shard,
                shards: cluster.shards,
                session: session.clone(),
                keys: keys.clone(),
                node_id: options.node_id.clone(),
                jobs: loaded.clone(),
                runs: runs.clone(),
                stop: shutdown.clone(),
                claim_lead: claim_lead.clone(),
                fleet: view.clone(),
            };
            shards.spawn(shard_task.run());
        }
        loop {
            tokio::select! {
                _ = session.lost().cancelled() => break,
                _ = shutdown.cancelled() => break,
                Some(config) = reloads.recv() => apply_reload(config, &cluster, &etcd, &loaded_sender),
            }
        }
        // Terms see the same tokens and end promptly; waiting for them guarantees no claim is
        // in flight when the lease is revoked.
        while shards.join_next().await.is_some() {}
        session.close().await;
        if !shutdown.is_cancelled() {
            let wait = backoff.next_delay();
            tracing::warn!(retry_in = ?wait, "campaigning again with a new session after a backoff");
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = shutdown.cancelled() => {}
            }
        } else {
            backoff.reset();
        }
    }

    tracing::info!("shutting down: shards resigned; waiting for running commands");
    runs.drain(options.shutdown_grace).await;
    drop(runs);
    if let Err(err) = result_writer.await {
        tracing::warn!(error = %err, "result writer ended abnormally");
    }
    tracing::info!("node stopped");
}

/// Keeps the fleet view current for this session, restarting the watch when it fails.
async fn keep_fleet_view(
    session: Session,
    keys: Keys,
    shards: u32,
    view: watch::Sender<FleetView>,
    shutdown: CancellationToken,
) {
    let mut backoff = Backoff::new();
    loop {
        tokio::select! {
            result = fleet::watch(&session, &keys, shards, &view) => {
                if let Err(err) = result {
                    tracing::warn!(error = %err, "fleet watch failed; restarting it");
                }
            }
            _ = session.lost().cancelled() => return,
            _ = shutdown.cancelled() => return,
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff.next_delay()) => {}
            _ = session.lost().cancelled() => return,
            _ = shutdown.cancelled() => return,
        }
    }
}

/// Logs each member whose jobs.toml differs from this node's, once per digest.
async fn warn_on_drift(
    mut view: watch::Receiver<FleetView>,
    mut loaded: watch::Receiver<Arc<Loaded>>,
    me: String,
    session: Session,
    shutdown: CancellationToken,
) {
    let mut reported = std::collections::BTreeSet::new();
    loop {
        {
            let digest = loaded.borrow_and_update().digest.clone();
            let current = view.borrow_and_update();
            for (id, member) in fleet::drifted(&current, &digest) {
                if reported.insert((id.to_string(), member.digest.clone(), digest.clone())) {
                    tracing::warn!(node = %me, other = id, its_digest = %member.digest, our_digest = %digest, its_shards = member.shards, "config drift: this member runs a different jobs.toml");
                }
            }
        }
        tokio::select! {
            changed = view.changed() => if changed.is_err() { return },
            changed = loaded.changed() => if changed.is_err() { return },
            _ = session.lost().cancelled() => return,
            _ = shutdown.cancelled() => return,
        }
    }
}

/// Swaps in a reloaded config's jobs. A changed `[cluster]` (jobs sharded for another count) or
/// `[etcd]` (the client is already connected) needs a restart; the old config keeps running.
fn apply_reload(
    config: Config,
    cluster: &crate::config::Cluster,
    etcd: &crate::config::Etcd,
    loaded: &watch::Sender<Arc<Loaded>>,
) {
    if config.cluster != *cluster || config.etcd != *etcd {
        tracing::error!(config = %config.path.display(), "reload refused: the [cluster] or [etcd] section changed; restart the node to apply it (the old jobs keep running)");
        return;
    }
    tracing::info!(jobs = config.jobs.len(), digest = %config.digest, "reloaded jobs.toml: terms take the new jobs between ticks, keeping their shards");
    loaded.send_replace(Arc::new(Loaded::new(config)));
}

/// Registers this node again with the new digest whenever a reload changes the jobs.
async fn register_reloads(
    session: Session,
    keys: Keys,
    node_id: String,
    mut member: Member,
    mut loaded: watch::Receiver<Arc<Loaded>>,
    shutdown: CancellationToken,
) {
    loop {
        tokio::select! {
            changed = loaded.changed() => if changed.is_err() { return },
            _ = session.lost().cancelled() => return,
            _ = shutdown.cancelled() => return,
        }
        member.digest = loaded.borrow_and_update().digest.clone();
        if let Err(err) = fleet::register(&session, &keys, &node_id, &member).await {
            tracing::warn!(error = %err, "cannot update this node's registration after a reload; others see the old digest until the next session");
        }
    }
}

/// Campaigns for one shard and leads it whenever elected, until the session ends.
struct ShardTask {
    shard: u32,
    shards: u32,
    session: Session,
    keys: Keys,
    node_id: String,
    jobs: watch::Receiver<Arc<Loaded>>,
    runs: Runs,
    stop: CancellationToken,
    claim_lead: ClaimLead,
    fleet: watch::Receiver<FleetView>,
}

impl ShardTask {
    async fn run(mut self) {
        let prefix = self.keys.election_prefix(self.shards, self.shard);
        let mut backoff = Backoff::new();
        loop {
            let campaign = tokio::select! {
                result = election::campaign(&self.session, &prefix, self.shard, &self.node_id) => result,
                _ = self.session.lost().cancelled() => return,
                _ = self.stop.cancelled() => return,
            };
            let leadership = match campaign {
                Ok(leadership) => leadership,
                Err(err) => {
                    self.pause(&err, &mut backoff).await;
                    if self.session.lost().is_cancelled() || self.stop.is_cancelled() {
                        return;
                    }
                    continue;
                }
            };
            backoff.reset();
            // One leadership may span several terms: a reload ends a term between ticks and the
            // next one leads on with the new jobs, without resigning. Runs keep retrying for as
            // long as the leadership lasts.
            let leading = CancellationToken::new();
            let _leading = leading.clone().drop_guard();
            let mut next = Some((leadership, Memory::default()));
            while let Some((held, memory)) = next.take() {
                let jobs = self.jobs.borrow_and_update().by_shard[self.shard as usize].clone();
                tracing::info!(
                    shard = self.shard,
                    fence = held.fence,
                    jobs = jobs.len(),
                    "leading shard"
                );
                let term = Term {
                    session: self.session.clone(),
                    keys: self.keys.clone(),
                    election_prefix: prefix.clone(),
                    node_id: self.node_id.clone(),
                    jobs,
                    jobs_reloaded: self.jobs.clone(),
                    runs: self.runs.clone(),
                    stop: self.stop.clone(),
                    leadership: held,
                    claim_lead: self.claim_lead.clone(),
                    shards: self.shards,
                    fleet: self.fleet.clone(),
                    leading: leading.clone(),
                    memory,
                };
                let shards_led = &crate::metrics::get().shards_led;
                shards_led.inc();
                let end = term.lead().await;
                shards_led.dec();
                tracing::info!(shard = self.shard, fence = term.leadership.fence, reason = ?end, "term ended");
                match end {
                    TermEnd::JobsReloaded(memory) => next = Some((term.leadership, memory)),
                    TermEnd::Deposed => {}
                    TermEnd::HandedOff => {
                        if let Err(err) = election::resign(&self.session, &term.leadership).await {
                            tracing::warn!(shard = self.shard, error = %err, "could not resign; the claims still keep each tick once");
                        }
                    }
                    TermEnd::Stopped | TermEnd::SessionLost => return,
                }
            }
        }
    }

    async fn pause(&self, err: &CoordError, backoff: &mut Backoff) {
        let wait = backoff.next_delay();
        tracing::warn!(shard = self.shard, error = %err, retry_in = ?wait, "campaign failed; retrying");
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = self.session.lost().cancelled() => {}
            _ = self.stop.cancelled() => {}
        }
    }
}

/// Capped exponential backoff with full jitter, so a fleet that lost etcd does not return in
/// lockstep.
pub struct Backoff {
    attempt: u32,
}

impl Backoff {
    const BASE: Duration = Duration::from_millis(200);
    const CAP: Duration = Duration::from_secs(5);

    pub fn new() -> Self {
        Backoff { attempt: 0 }
    }

    pub fn next_delay(&mut self) -> Duration {
        let ceiling = Self::BASE.saturating_mul(1 << self.attempt.min(10)).min(Self::CAP);
        self.attempt += 1;
        let millis = ceiling.as_millis() as u64;
        Duration::from_millis(rand::thread_rng().gen_range(millis / 2..=millis))
    }

    pub fn reset(&mut self) {
        self.attempt = 0;
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::Backoff;
    use std::time::Duration;

    #[test]
    fn backoff_grows_jittered_and_capped() {
        let mut backoff = Backoff::new();
        let first = backoff.next_delay();
        assert!(first >= Duration::from_millis(100) && first <= Duration::from_millis(200));
        for _ in 0..20 {
            assert!(backoff.next_delay() <= Backoff::CAP);
        }
        backoff.reset();
        assert!(backoff.next_delay() <= Duration::from_millis(200));
    }
}
