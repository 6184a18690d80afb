//! The fleet: who is alive, which shards each node should lead, and when a leader should hand a
//! shard to its target owner.
//!
//! Every node registers `/nodes/<id>` on its lease and watches the member and election prefixes.
//! From the same live member set every node computes the same target assignment: bounded-load
//! rendezvous hashing, each node capped at ceil(N/M) shards, so a join or a leave moves about
//! N/M shards. Every node stands by in every election, so a dead node's shards fail over within
//! a TTL; a leader that is not a shard's target hands it over once the target is campaigning.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use std::time::Duration;

use etcd_client::{EventType, PutOptions, WatchOptions};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::backoff::{sleep_or_cancel, Backoff};
use crate::coord::election;
use crate::coord::etcd::{self, CoordError};
use crate::coord::keys::{ElectionKeys, Keys};
use crate::coord::session::Session;
use crate::coord::view::{self, Ballot, Candidate, Entered, FleetView, Members};
use crate::rules::record::Member;

/// Registers this node under `/nodes/<id>` on the session's lease.
pub async fn register(session: &Session, keys: &Keys, node_id: &str, member: &Member) -> Result<(), CoordError> {
    let value = serde_json::to_vec(member).map_err(|err| CoordError::Protocol(err.to_string()))?;
    let options = PutOptions::new().with_lease(session.lease());
    etcd::call(session.client().put(keys.node(node_id), value, Some(options))).await?;
    Ok(())
}

/// How often at most the fleet view is published while watch events keep coming: thousands of
/// election keys put at once (a fleet of many shards starting) make one view, not thousands.
const PUBLISH_EVERY: Duration = Duration::from_millis(20);

/// Every live member, by node id, and the revision of the read.
pub async fn read_members(client: &etcd_client::Client, keys: &Keys) -> Result<(Members, i64), CoordError> {
    let (read, revision) = etcd::read_prefix(client, &keys.nodes_prefix()).await?;
    let mut members = Members::default();
    for kv in &read {
        members.apply(keys, kv.key(), Some((kv.value(), kv.lease())));
    }
    Ok((members, revision))
}

/// Every candidate of the elections `keys` names, and the revision of the read.
pub(crate) async fn read_ballot(
    client: &etcd_client::Client,
    keys: &ElectionKeys,
) -> Result<(Ballot, i64), CoordError> {
    let (read, revision) = etcd::read_prefix(client, &keys.keys.shards_prefix()).await?;
    let mut ballot = Ballot::new(keys.elections.total());
    for kv in &read {
        ballot.apply(keys, kv.key(), Some(entered(kv)));
    }
    Ok((ballot, revision))
}

fn entered(kv: &etcd_client::KeyValue) -> Entered<'_> {
    Entered {
        node: kv.value(),
        term: kv.create_revision(),
        lease: kv.lease(),
    }
}

/// Keeps a [`FleetView`] current from etcd until the session ends. Returns when a watch fails;
/// the caller restarts it.
async fn watch(session: &Session, elections: &ElectionKeys, view: &watch::Sender<FleetView>) -> Result<(), CoordError> {
    let client = session.client();
    let keys = &elections.keys;
    let shards = elections.elections.total();
    let (mut members, members_read) = read_members(&client, keys).await?;
    let (mut ballot, ballot_read) = read_ballot(&client, elections).await?;
    let mut targets = Arc::new(view::targets(&members.nodes, elections));
    // The foreign keys of each shard that has any, kept apart so a publish looks only at the
    // shards that changed.
    let mut foreign = BTreeMap::new();
    publish(view, &members, &targets, &ballot, &mut foreign, (0..shards).collect());
    let mut members_changed = false;
    // Shards whose election changed since the view was last published.
    let mut changed_shards = BTreeSet::new();
    let mut publishing = tokio::time::interval(PUBLISH_EVERY);
    publishing.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);

    // Each watch goes on from its own read: replaying the other read's older events onto a
    // newer read would show, for a moment, keys that were already gone (a node could believe it
    // leads behind a candidate deleted before the read).
    let mut node_watch = etcd::call(client.clone().watch(
        keys.nodes_prefix(),
        Some(WatchOptions::new().with_prefix().with_start_revision(members_read + 1)),
    ))
    .await?;
    let mut election_watch = etcd::call(client.clone().watch(
        keys.shards_prefix(),
        Some(WatchOptions::new().with_prefix().with_start_revision(ballot_read + 1)),
    ))
    .await?;
    loop {
        tokio::select! {
            message = node_watch.message() => {
                let Some(response) = message? else { return Ok(()) };
                // Cancelled because its revision was compacted: the caller reads both again.
                if etcd::compacted(&response, "the fleet")?.is_some() {
                    return Ok(());
                }
                for event in response.events() {
                    let Some(kv) = event.kv() else { continue };
                    let put = (event.event_type() == EventType::Put).then(|| (kv.value(), kv.lease()));
                    members.apply(keys, kv.key(), put);
                }
                members_changed = true;
            }
            message = election_watch.message() => {
                let Some(response) = message? else { return Ok(()) };
                // Cancelled because its revision was compacted: the caller reads both again.
                if etcd::compacted(&response, "the fleet")?.is_some() {
                    return Ok(());
                }
                for event in response.events() {
                    let Some(kv) = event.kv() else { continue };
                    let put = (event.event_type() == EventType::Put).then(|| entered(kv));
                    changed_shards.extend(ballot.apply(elections, kv.key(), put));
                }
            }
            _ = publishing.tick(), if members_changed || !changed_shards.is_empty() => {
                if members_changed {
                    targets = Arc::new(view::targets(&members.nodes, elections));
                    // Who may lead any shard depends on the members' leases.
                    changed_shards.extend(0..shards);
                    members_changed = false;
                }
                publish(view, &members, &targets, &ballot, &mut foreign, std::mem::take(&mut changed_shards));
            }
        }
    }
}

/// Brings the published view up to date: the members and targets, and the elections of
/// `changed` shards. The view is changed in place, shard by shard, so a burst of election
/// events costs what it touched, not a copy of every shard's candidates.
fn publish(
    view: &watch::Sender<FleetView>,
    members: &Members,
    targets: &Arc<Vec<Option<String>>>,
    ballot: &Ballot,
    foreign: &mut BTreeMap<u32, Vec<Candidate>>,
    changed: BTreeSet<u32>,
) {
    let member_leases = members.leases();
    let mut foreign_changed = false;
    view.send_if_modified(|current| {
        let mut modified = false;
        if *current.members != members.nodes {
            current.members = Arc::new(members.nodes.clone());
            modified = true;
        }
        let unread_members = members.has_unread();
        if current.unread_members != unread_members {
            current.unread_members = unread_members;
            modified = true;
        }
        if !Arc::ptr_eq(&current.targets, targets) {
            current.targets = Arc::clone(targets);
            modified = true;
        }
        let shards = targets.len();
        current.candidates.resize(shards, BTreeSet::new());
        current.leaders.resize(shards, None);
        for shard in changed {
            let shard_foreign: Vec<Candidate> = ballot.foreign(shard, &member_leases).cloned().collect();
            if foreign.get(&shard).map_or(&[][..], Vec::as_slice) != shard_foreign.as_slice() {
                foreign_changed = true;
                if shard_foreign.is_empty() {
                    foreign.remove(&shard);
                } else {
                    foreign.insert(shard, shard_foreign);
                }
            }
            let candidates: BTreeSet<String> = ballot
                .candidates(shard)
                .iter()
                .filter(|candidate| candidate.is_member(&member_leases))
                .map(|candidate| candidate.node.clone())
                .collect();
            let leader = ballot
                .leader(shard, &member_leases)
                .map(|leader| (leader.node.clone(), leader.term));
            let (Some(held), Some(held_leader)) = (
                current.candidates.get_mut(shard as usize),
                current.leaders.get_mut(shard as usize),
            ) else {
                continue;
            };
            if *held != candidates || *held_leader != leader {
                *held = candidates;
                *held_leader = leader;
                modified = true;
            }
        }
        if foreign_changed {
            let every: Vec<Candidate> = foreign.values().flatten().cloned().collect();
            crate::metrics::get().election_foreign_keys.set(every.len() as i64);
            current.foreign = Arc::new(every);
            modified = true;
        }
        if modified {
            let leaderless = current.leaders.iter().filter(|leader| leader.is_none()).count();
            crate::metrics::get().shards_without_leader.set(leaderless as i64);
        }
        modified
    });
}

/// Starts this session's fleet tasks: the view every term reads, and the removal of election
/// keys no member put. They end with the session.
pub(crate) fn spawn_tasks(
    tasks: &mut JoinSet<()>,
    session: &Session,
    keys: &ElectionKeys,
) -> watch::Receiver<FleetView> {
    let (view_sender, view) = watch::channel(FleetView::default());
    tasks.spawn(keep_view(session.clone(), keys.clone(), view_sender));
    tasks.spawn(remove_foreign_keys(session.clone(), keys.keys.clone(), view.clone()));
    view
}

/// A fleet view of the elections `keys` names, kept current for `session` by a task of its own.
#[cfg(test)]
pub(crate) fn watch_view(session: &Session, keys: &ElectionKeys) -> watch::Receiver<FleetView> {
    let (sender, view) = watch::channel(FleetView::default());
    tokio::spawn(keep_view(session.clone(), keys.clone(), sender));
    view
}

/// Keeps the fleet view current for this session, restarting the watch when it fails.
async fn keep_view(session: Session, keys: ElectionKeys, view: watch::Sender<FleetView>) {
    let mut backoff = Backoff::coordination();
    loop {
        tokio::select! {
            result = watch(&session, &keys, &view) => {
                if let Err(err) = result {
                    tracing::warn!(error = %err, "fleet watch failed; restarting it");
                }
            }
            _ = session.ended().cancelled() => return,
        }
        if !sleep_or_cancel(backoff.next_delay(), session.ended()).await {
            return;
        }
    }
}

/// How many foreign keys one pass removes, and how soon the ones left (or whose removal failed)
/// are tried again: a flood of foreign keys must not crowd out the term's own etcd calls.
const FOREIGN_PER_PASS: usize = 64;
const FOREIGN_RECHECK: Duration = Duration::from_secs(1);

/// Warns once of each candidate key that no live member put, and removes it once etcd confirms
/// that, so the shard's election goes on among members: a leaseless key left in front of an
/// election would lead it for good once the real leader campaigned again.
async fn remove_foreign_keys(session: Session, keys: Keys, mut view: watch::Receiver<FleetView>) {
    let mut reported: BTreeSet<(Vec<u8>, i64)> = BTreeSet::new();
    loop {
        let foreign = Arc::clone(&view.borrow_and_update().foreign);
        let present: BTreeSet<(Vec<u8>, i64)> = foreign
            .iter()
            .map(|candidate| (candidate.key.clone(), candidate.term))
            .collect();
        reported.retain(|seen| present.contains(seen));
        for candidate in foreign.iter().take(FOREIGN_PER_PASS) {
            let key = String::from_utf8_lossy(&candidate.key);
            if reported.insert((candidate.key.clone(), candidate.term)) {
                tracing::warn!(%key, node = %candidate.node, create_revision = candidate.term, lease = candidate.lease.map(|lease| format!("{lease:x}")), "a shard election holds a key that no live member put (no lease, or a lease no member holds): it never leads; removing it");
            }
            match election::remove_foreign(&session, &keys, candidate).await {
                Ok(true) => tracing::info!(%key, "removed a foreign key from a shard election"),
                Ok(false) => {}
                Err(err) => {
                    if let Some(left_out) = crate::repeats::log_now("foreign election key") {
                        tracing::warn!(%key, error = %err, left_out, "cannot remove a foreign election key yet; trying again (left_out: lines like this one not logged since the last)");
                    }
                }
            }
        }
        let recheck = !foreign.is_empty();
        tokio::select! {
            changed = view.changed() => if changed.is_err() { return },
            _ = tokio::time::sleep(FOREIGN_RECHECK), if recheck => {}
            _ = session.ended().cancelled() => return,
        }
    }
}

/// The task that writes this node's registration again when a reload changes its digest, or
/// its calls move to another etcd member: `status` shows both.
pub(crate) struct Reregistration {
    pub(crate) session: Session,
    pub(crate) keys: Keys,
    pub(crate) node_id: String,
    pub(crate) member: Member,
    pub(crate) jobs: watch::Receiver<Arc<crate::rules::config::Loaded>>,
    pub(crate) etcd_member: watch::Receiver<Option<String>>,
}

impl Reregistration {
    /// Registers again at each change, until `cancel`.
    pub(crate) async fn run(mut self, cancel: CancellationToken) {
        loop {
            tokio::select! {
                changed = self.jobs.changed() => if changed.is_err() { return },
                changed = self.etcd_member.changed() => if changed.is_err() { return },
                _ = cancel.cancelled() => return,
            }
            self.member.digest = self.jobs.borrow_and_update().digest.clone();
            self.member.etcd = self.etcd_member.borrow_and_update().clone();
            if let Err(err) = register(&self.session, &self.keys, &self.node_id, &self.member).await {
                tracing::warn!(error = %err, "cannot update this node's registration; others see the old digest and etcd member until the next session");
            }
        }
    }
}
