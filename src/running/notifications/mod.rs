//! Telling people about runs: each finished run of a job with `notify` is accounted for in the
//! job's notification record, and the events it adds are POSTed to their notifiers with
//! retries; each success of a job with `ping_url` is pinged once.
//!
//! None of it is on the firing path: runs hand their records to a bounded queue and go on; the
//! node's one task hands each job's records, in order, to a task of that job's own, which
//! accounts for them and sends each event from a task of its own. A job whose record etcd keeps
//! refusing thus holds back only its own runs.
//!
//! A stopping node goes on telling until its last runs ended (its shutdown grace), then gives
//! what they told at most [`FLUSH`] more: whatever is accounted for and not yet delivered then
//! stays in the job's record, for the shard's leader (this node left the fleet) or this node's
//! next start to send.
//!
//! The parts, one question each: what a run hands over ([`outbox`]), how each job's notes wait
//! their turn ([`job_queues`]), how a note is accounted for in the job's record and what a stop
//! flushes ([`accounting`]), how an event is sent and taken off the record ([`delivery`]), a
//! success's ping ([`pings`]), what goes on the wire to a receiver ([`webhook`]), and the events
//! records hold that no live process sends ([`unsent`]).

mod accounting;
mod delivery;
mod job_queues;
mod outbox;
mod pings;
mod unsent;
mod webhook;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::coord::keys::Keys;
use crate::metrics::ResultLabel;
use job_queues::JobQueues;

pub(crate) use outbox::{Note, Outbox};
pub(crate) use unsent::UnsentNotifications;

/// Finished runs waiting to be accounted for: a node that cannot reach etcd for a while keeps
/// this many, then drops (and counts) the rest rather than grow.
const QUEUE: usize = 10_000;
/// At most this many etcd calls accounting for runs at once, across jobs: each job has a task
/// of its own, and a fleet of thousands must not send thousands of transactions at once.
const ACCOUNTING_CALLS: usize = 16;
/// How long a stopping node goes on accounting for and sending what its last runs told, once
/// they all ended. Within the example unit's `TimeoutStopSec` past `--shutdown-grace`.
pub(crate) const FLUSH: Duration = Duration::from_secs(10);
/// At most this many success pings in flight: a ping service that stalls must not hold a
/// socket and a task per success (descriptors are shared with runs). Past it a ping is dropped
/// and counted.
const PINGS_IN_FLIGHT: usize = 64;

/// The node's sender of notifications and pings.
pub(crate) struct Notifications {
    /// `None`: the client could not be built; nothing is sent (see [`new`]).
    http: Option<reqwest::Client>,
    etcd: etcd_client::Client,
    keys: Keys,
    node_id: String,
    /// The events this process is sending now, by job and dedupe key and notifier: a sweep
    /// that finds them in etcd leaves them be.
    sending: Mutex<HashSet<(String, String, String)>>,
    /// Each job's runs waiting for its accounting task, in the order they were handed over.
    queued: Mutex<JobQueues<Note>>,
    /// Runs handed over and not yet accounted for, to bound `queued` as the inbox is bounded.
    room: Arc<Semaphore>,
    accounting: Semaphore,
    /// Every task this sends from: accounting, deliveries, pings. A stop waits for them.
    tracker: TaskTracker,
    /// Cancelled once a stop's flush is over: what still sleeps between attempts ends.
    stop: CancellationToken,
}

/// A queue for runs to hand their records to, and what reads it: run [`Notifications::run`].
/// A webhook client that cannot be built is logged as an error and turns notifications and
/// pings off on this node (each run that would tell is counted `dropped`): the node still runs
/// its jobs, and never sends through a client without the timeouts and redirect policy.
pub(crate) fn new(
    etcd: etcd_client::Client,
    keys: Keys,
    node_id: String,
) -> (Outbox, Arc<Notifications>, mpsc::Receiver<Note>) {
    let (sender, inbox) = mpsc::channel(QUEUE);
    let http = webhook::client();
    let notifications = Arc::new(Notifications {
        http,
        etcd,
        keys,
        node_id,
        sending: Mutex::default(),
        queued: Mutex::default(),
        room: Arc::new(Semaphore::new(QUEUE)),
        accounting: Semaphore::new(ACCOUNTING_CALLS),
        tracker: TaskTracker::new(),
        stop: CancellationToken::new(),
    });
    let outbox = Outbox {
        sender,
        http: notifications.http.clone(),
        pings: Arc::new(Semaphore::new(PINGS_IN_FLIGHT)),
        tracker: notifications.tracker.clone(),
        stop: notifications.stop.clone(),
    };
    (outbox, notifications, inbox)
}

fn count(
    family: &prometheus_client::metrics::family::Family<ResultLabel, prometheus_client::metrics::counter::Counter>,
    result: &'static str,
) {
    family.get_or_create(&ResultLabel { result }).inc();
}
