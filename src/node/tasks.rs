//! Every long-lived task of a node, started here, the one list of them: the node's own
//! (readiness on shutdown, etcd's space, the activity count, the sweep of group slots, the asks
//! of other nodes' leaders, the kill of running commands on a second signal) and each session's
//! (the fleet view, the registration and drift warnings, every mirror of the node's list, the
//! give-back of unheld backfill ticks, unsent notifications, unserved pools, gone nodes,
//! compaction, and a task per shard). Each lives with its feature, as a value with
//! `run(self, cancel)` where it has state of its own, and ends with the token it is given.

use std::sync::Arc;

use tokio::sync::watch;
use tokio::task::JoinSet;

use super::NodeOptions;
use crate::context::NodeContext;
use crate::coord::backfills::GiveBackUnheld;
use crate::coord::drift::DriftWarnings;
use crate::coord::election::Leadership;
use crate::coord::fleet;
use crate::coord::mirror;
use crate::coord::session::Session;
use crate::coord::view::FleetView;
use crate::leader;
use crate::readiness::Stage;
use crate::rules::config::Etcd;
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
    let reregistration = fleet::Reregistration {
        session: session.clone(),
        keys: node.identity.keys.clone(),
        node_id: node.identity.node_id.clone(),
        member,
        jobs: node.jobs.clone(),
        etcd_member: node.etcd.etcd_member.clone(),
    };
    tasks.spawn(reregistration.run(session.ended().clone()));
    let drift = DriftWarnings {
        node_id: node.identity.node_id.clone(),
        jobs: node.jobs.clone(),
        view: view.clone(),
    };
    tasks.spawn(drift.run(session.ended().clone()));
    view
}

/// What a session read before it led anything: each mirror and the revision it continues from.
pub(super) type Mirrored = Vec<(Arc<dyn mirror::AnyMirror>, i64)>;

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
    for (mirror, read) in mirrored {
        tasks.spawn(mirror.keep_current(session.clone(), node.identity.keys.clone(), read));
    }
    let give_back = GiveBackUnheld {
        backfills: Arc::clone(&node.mirrors.backfills),
        node_id: node.identity.node_id.clone(),
        keys: node.identity.keys.clone(),
        jobs: node.jobs.clone(),
        session: session.clone(),
    };
    tasks.spawn(give_back.run(session.ended().clone()));
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
