//! Every long-lived task of a node, started here: the node's own (readiness on shutdown, etcd's
//! space, the kill of running commands on a second signal) and each session's (the fleet view,
//! the registration and drift warnings, the mirrors of pauses and run requests, compaction, and
//! a task per shard). Each ends with the token it is given.

use std::collections::BTreeSet;
use std::sync::Arc;

use tokio::sync::watch;
use tokio::task::JoinSet;

use super::NodeOptions;
use crate::context::NodeContext;
use crate::coord::backfills;
use crate::coord::election::Leadership;
use crate::coord::fleet;
use crate::coord::mirror;
use crate::coord::session::Session;
use crate::coord::view::{self, FleetView};
use crate::leader;
use crate::readiness::Stage;
use crate::rules::backfill::InFlight;
use crate::rules::config::{Delivery, Etcd};
use crate::rules::record::Member;
use crate::running::notifications::UnsentNotifications;

/// The node's tasks that outlive sessions; they end with the process or its shutdown.
pub(super) fn spawn_node_tasks(
    node: &Arc<NodeContext>,
    options: &NodeOptions,
    client: &etcd_client::Client,
    etcd: &Etcd,
) {
    let stopping = {
        let (readiness, shutdown) = (options.readiness.clone(), node.shutdown.clone());
        async move {
            shutdown.cancelled().await;
            readiness.set(Stage::Stopping);
        }
    };
    tokio::spawn(stopping);
    tokio::spawn(crate::coord::etcd_space::follow(
        client.clone(),
        etcd.endpoints.clone(),
        options.readiness.clone(),
        node.shutdown.clone(),
    ));
    let pauses = Arc::clone(&node.mirrors.pauses);
    crate::metrics::get().count_pauses(move || pauses.in_force(crate::clock::now()));
    tokio::spawn(Arc::clone(&node.work.activity).publish(
        client.clone(),
        node.identity.keys.clone(),
        node.identity.node_id.clone(),
        Arc::clone(&node.mirrors.groups),
        node.shutdown.clone(),
    ));
    // Opened now: the first runs of the node list themselves going on it.
    node.mirrors.groups.lease_now();
    tokio::spawn(Arc::clone(&node.mirrors.groups).sweep(node.mirrors.groups.runs_ended()));
    tokio::spawn(crate::coord::going::follow_asks(
        client.clone(),
        node.identity.keys.clone(),
        node.identity.node_id.clone(),
        crate::running::runs::AskedHere {
            runs: node.work.runs.clone(),
            listed: Arc::clone(&node.work.started_here),
        },
        node.mirrors.groups.runs_ended(),
    ));
    crate::coord::group_gauges::export(Arc::clone(&node.mirrors.groups), node.jobs.clone());
    let killer = {
        let (runs, hurry) = (node.work.runs.clone(), options.hurry.clone());
        async move {
            hurry.cancelled().await;
            runs.kill_all();
        }
    };
    tokio::spawn(killer);
}

/// A session's tasks before it enters the elections: the fleet view that entering waits on,
/// with the removal of election keys no member put, this node's registration kept current
/// across reloads, and drift warnings.
pub(super) fn watch_fleet(
    tasks: &mut JoinSet<()>,
    node: &Arc<NodeContext>,
    session: &Session,
    member: Member,
) -> watch::Receiver<FleetView> {
    let view = fleet::spawn_tasks(tasks, session, &node.identity.election_keys);
    tasks.spawn(register_reloads(Arc::clone(node), session.clone(), member));
    tasks.spawn(warn_on_drift(Arc::clone(node), session.clone(), view.clone()));
    view
}

/// What a session read before it led anything: the revisions its mirrors continue from.
pub(super) struct Mirrored {
    pub(super) pauses: i64,
    pub(super) triggers: i64,
    pub(super) groups: i64,
    pub(super) backfills: i64,
}

/// A session's tasks once it entered the elections: the mirrors of pauses, run requests and
/// concurrency groups,
/// the marks of `run_on` sets no node has, the removal of gone nodes' records, compaction if
/// `[etcd] compaction` asks for it, and a
/// task per shard it stands in.
pub(super) fn lead(
    tasks: &mut JoinSet<()>,
    node: &Arc<NodeContext>,
    session: &Session,
    view: &watch::Receiver<FleetView>,
    mirrored: Mirrored,
    etcd: &Etcd,
    candidacies: Vec<Leadership>,
) {
    tasks.spawn(mirror::keep(
        session.clone(),
        node.identity.keys.clone(),
        Arc::clone(&node.mirrors.pauses),
        mirrored.pauses,
    ));
    tasks.spawn(mirror::keep(
        session.clone(),
        node.identity.keys.clone(),
        Arc::clone(&node.mirrors.triggers),
        mirrored.triggers,
    ));
    tasks.spawn(mirror::keep(
        session.clone(),
        node.identity.keys.clone(),
        Arc::clone(&node.mirrors.groups),
        mirrored.groups,
    ));
    tasks.spawn(mirror::keep(
        session.clone(),
        node.identity.keys.clone(),
        Arc::clone(&node.mirrors.backfills),
        mirrored.backfills,
    ));
    tasks.spawn(give_back_unheld_backfills(Arc::clone(node), session.clone()));
    let unsent = UnsentNotifications::new(Arc::clone(&node.work.notifications), node.jobs.clone(), view.clone());
    tasks.spawn(unsent.run(session.ended().clone()));
    tasks.spawn(crate::coord::unserved::keep(
        session.clone(),
        node.identity.keys.clone(),
        node.identity.node_id.clone(),
        node.jobs.clone(),
        view.clone(),
    ));
    let gone_nodes = crate::coord::gone_nodes::GoneNodes::new(
        session.clone(),
        node.identity.keys.clone(),
        node.identity.node_id.clone(),
        etcd.gone_node_retention,
        view.clone(),
    );
    tasks.spawn(gone_nodes.run(session.ended().clone()));
    if let Some(every) = etcd.compaction {
        tasks.spawn(crate::coord::etcd_space::compact(
            session.clone(),
            node.identity.keys.clone(),
            node.identity.node_id.clone(),
            every,
            view.clone(),
        ));
    }
    for candidacy in candidacies {
        tasks.spawn(leader::run_shard(
            Arc::clone(node),
            session.clone(),
            view.clone(),
            candidacy,
        ));
    }
}

/// Gives back the backfill ticks the records list in flight on this node that it does not hold:
/// claimed by an earlier run of the node, they will never be counted otherwise.
async fn give_back_unheld_backfills(node: Arc<NodeContext>, session: Session) {
    // Looked at again this often while some are left (a failed write, or a count given up on,
    // which changes no record).
    const AGAIN: std::time::Duration = std::time::Duration::from_secs(5);
    let mut changed = node.mirrors.backfills.subscribe();
    loop {
        for job in node.mirrors.backfills.unheld_on(&node.identity.node_id) {
            let delivery = node
                .jobs
                .borrow()
                .by_shard
                .iter()
                .flatten()
                .find(|known| known.name == job)
                .map_or(Delivery::AtLeastOnce, |known| known.delivery);
            let backfills = &node.mirrors.backfills;
            let orphaned = |flight: &InFlight| flight.node == node.identity.node_id && !backfills.holds(&job, flight);
            if let Err(err) =
                backfills::settle_orphans(&session.client(), &node.identity.keys, &job, delivery, orphaned).await
            {
                tracing::warn!(job, error = %err, "cannot give back this node's backfill ticks from before it started; trying again at the next change");
            }
        }
        let left = !node.mirrors.backfills.unheld_on(&node.identity.node_id).is_empty();
        tokio::select! {
            result = changed.changed() => if result.is_err() { return },
            _ = tokio::time::sleep(AGAIN), if left => {}
            _ = session.ended().cancelled() => return,
        }
    }
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
                    tracing::warn!(node = %node.identity.node_id, other = id, its_digest = %member.digest, our_digest = %digest, its_shards = member.shards, "config drift: this member runs a different jobs.toml");
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
/// Writes the node's registration again when a reload changes its digest, or its calls move
/// to another etcd member: `status` shows both.
async fn register_reloads(node: Arc<NodeContext>, session: Session, mut member: Member) {
    let mut loaded = node.jobs.clone();
    let mut etcd_member = node.etcd.etcd_member.clone();
    loop {
        tokio::select! {
            changed = loaded.changed() => if changed.is_err() { return },
            changed = etcd_member.changed() => if changed.is_err() { return },
            _ = session.ended().cancelled() => return,
        }
        member.digest = loaded.borrow_and_update().digest.clone();
        member.etcd = etcd_member.borrow_and_update().clone();
        if let Err(err) = fleet::register(&session, &node.identity.keys, &node.identity.node_id, &member).await {
            tracing::warn!(error = %err, "cannot update this node's registration; others see the old digest and etcd member until the next session");
        }
    }
}
