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

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::{mpsc, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::backoff::{sleep_or_cancel, Backoff};
use crate::clock;
use crate::coord::keys::Keys;
use crate::coord::notifications;
use crate::metrics::ResultLabel;
use crate::rules::config::Job;
use crate::rules::notify::{
    self, url_origin, Body, HeaderValue, Notifier, Pending, PingMethod, DELIVERY_PATIENCE, SEND_TIMEOUT,
};
use crate::rules::record::RunRecord;

/// Finished runs waiting to be accounted for: a node that cannot reach etcd for a while keeps
/// this many, then drops (and counts) the rest rather than grow.
const QUEUE: usize = 10_000;
/// The largest header file read.
const MAX_HEADER_FILE: u64 = 64 * 1024;
/// How often an etcd call that accounts for a run is tried before the run is given up on.
const ACCOUNT_TRIES: u32 = 5;
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
/// Idle connections kept per receiver: enough for the pings and events in flight to one host
/// to reuse, without keeping a descriptor per burst.
const IDLE_PER_HOST: usize = 8;

/// What happened that may be worth telling.
pub(crate) enum Note {
    /// A run ended (or a tick was recorded without one).
    Ran(Arc<Job>, RunRecord),
    /// A takeover left `count` missed ticks unrun, the newest at `newest`, having read the
    /// job's record at revision `fence`.
    Missed {
        job: Arc<Job>,
        count: usize,
        newest: DateTime<Utc>,
        fence: i64,
    },
}

impl Note {
    fn job(&self) -> &Arc<Job> {
        match self {
            Note::Ran(job, _) | Note::Missed { job, .. } => job,
        }
    }
}

/// What runs hand over. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Outbox {
    sender: mpsc::Sender<Note>,
    /// `None`: the client could not be built, and nothing is told (logged once at the start).
    http: Option<reqwest::Client>,
    pings: Arc<Semaphore>,
    tracker: TaskTracker,
    stop: CancellationToken,
}

impl Outbox {
    /// An outbox nothing reads, for unit tests of runs of jobs with no one to tell.
    #[cfg(test)]
    pub(crate) fn unread() -> Outbox {
        Outbox {
            sender: mpsc::channel(1).0,
            http: Some(reqwest::Client::new()),
            pings: Arc::new(Semaphore::new(PINGS_IN_FLIGHT)),
            tracker: TaskTracker::new(),
            stop: CancellationToken::new(),
        }
    }

    /// Pings the job's `ping_url` for a success, and hands `record` over for its notifiers
    /// (with no more of its output than an event carries), if it has any.
    pub(crate) fn ran(&self, job: &Arc<Job>, record: &RunRecord) {
        if let Some(ping) = job.ping.as_ref().filter(|_| record.succeeded()) {
            self.ping(&job.name, &ping.url, ping.method);
        }
        if job.notify.is_empty() {
            return;
        }
        self.send(job, Note::Ran(Arc::clone(job), notify::kept(record)));
    }

    fn ping(&self, job: &str, url: &str, method: PingMethod) {
        let pings = &crate::metrics::get().pings;
        let permit = match (&self.http, Arc::clone(&self.pings).try_acquire_owned()) {
            (Some(http), Ok(permit)) => (http.clone(), permit),
            (http, _) => {
                count(pings, "dropped");
                if let Some(left_out) = crate::repeats::log_now("ping dropped") {
                    match http {
                        Some(_) => tracing::warn!(job, in_flight = PINGS_IN_FLIGHT, left_out, "success ping dropped: too many pings wait for their answer (left_out: lines like this one not logged since the last)"),
                        None => tracing::warn!(job, left_out, "success ping dropped: this node has no webhook client (left_out: lines like this one not logged since the last)"),
                    }
                }
                return;
            }
        };
        let (http, permit) = permit;
        let (stop, job, url) = (self.stop.clone(), job.to_string(), url.to_string());
        self.tracker.spawn(async move {
            send_ping(http, stop, job, url, method).await;
            drop(permit);
        });
    }

    /// Hands over missed ticks a takeover left unrun, if the job has anyone to tell.
    pub(crate) fn missed(&self, job: &Arc<Job>, count: usize, newest: DateTime<Utc>, fence: i64) {
        if job.notify.is_empty() {
            return;
        }
        let note = Note::Missed {
            job: Arc::clone(job),
            count,
            newest,
            fence,
        };
        self.send(job, note);
    }

    fn send(&self, job: &Job, note: Note) {
        match self.sender.try_send(note) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => {
                if let Some(left_out) = crate::repeats::log_now("notification queue full") {
                    tracing::warn!(job = %job.name, left_out, "too many finished runs wait to be accounted for notifications: this one is dropped (left_out: lines like this one not logged since the last)");
                }
                count(&crate::metrics::get().notifications, "dropped");
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                if let Some(left_out) = crate::repeats::log_now("notifications closed") {
                    tracing::warn!(job = %job.name, left_out, "a finished run is not accounted for notifications: this node's notifications are off or stopped (left_out: lines like this one not logged since the last)");
                }
                count(&crate::metrics::get().notifications, "dropped");
            }
        }
    }
}

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

/// Each job's waiting items in the order they came, for one worker per job: a job's items
/// stay in order (an older run accounted for after a newer one would be ignored), and no job
/// waits behind another's. A job is known while its worker runs.
struct JobQueues<T> {
    by_job: HashMap<String, VecDeque<T>>,
}

impl<T> Default for JobQueues<T> {
    fn default() -> Self {
        JobQueues { by_job: HashMap::new() }
    }
}

impl<T> JobQueues<T> {
    /// Queues `item` behind `job`'s others; `true` when the job has no worker: start one.
    fn push(&mut self, job: &str, item: T) -> bool {
        if let Some(waiting) = self.by_job.get_mut(job) {
            waiting.push_back(item);
            return false;
        }
        self.by_job.insert(job.to_string(), VecDeque::from([item]));
        true
    }

    /// The job's next item for its worker; `None` ends the worker, and the job is forgotten
    /// in the same step, so the next [`JobQueues::push`] starts another.
    fn next(&mut self, job: &str) -> Option<T> {
        let next = self.by_job.get_mut(job).and_then(VecDeque::pop_front);
        if next.is_none() {
            self.by_job.remove(job);
        }
        next
    }

    /// How many items wait, across jobs.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.by_job.values().map(VecDeque::len).sum()
    }

    /// Forgets every waiting item (their workers end at their next look); how many there were.
    fn clear(&mut self) -> usize {
        self.by_job.values_mut().map(|waiting| waiting.drain(..).count()).sum()
    }
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
    let http = reqwest::Client::builder()
        .timeout(SEND_TIMEOUT)
        .connect_timeout(SEND_TIMEOUT)
        .redirect(reqwest::redirect::Policy::none())
        .pool_max_idle_per_host(IDLE_PER_HOST)
        .user_agent(concat!("shardcron/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|err| {
            tracing::error!(error = %err, "cannot build the webhook client: this node sends no notifications and no success pings");
        })
        .ok();
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

impl Notifications {
    /// Accounts for each run handed over until `closed` (cancelled once the node's last runs
    /// ended), then for those still queued, and sends what they add, for at most [`FLUSH`]
    /// (less if `hurry` is cancelled).
    pub(crate) async fn run(
        self: Arc<Self>,
        mut inbox: mpsc::Receiver<Note>,
        closed: CancellationToken,
        hurry: CancellationToken,
    ) {
        if self.http.is_none() {
            // Runs see a closed queue and count what they hand over as dropped.
            return;
        }
        loop {
            let room = tokio::select! {
                room = Arc::clone(&self.room).acquire_owned() => room,
                _ = closed.cancelled() => break,
            };
            let Ok(room) = room else { break };
            let note = tokio::select! {
                received = inbox.recv() => match received {
                    Some(received) => received,
                    None => break,
                },
                _ = closed.cancelled() => break,
            };
            self.queue(note, room);
        }
        self.flush(inbox, hurry).await;
    }

    /// Gives the runs still in `inbox` and every task in flight at most [`FLUSH`], then stops
    /// them; what is not accounted for by then is counted `dropped`.
    async fn flush(self: &Arc<Self>, mut inbox: mpsc::Receiver<Note>, hurry: CancellationToken) {
        let deadline = tokio::time::Instant::now() + FLUSH;
        inbox.close();
        // The last of them: no room is waited for, the inbox bounds them.
        while let Ok(note) = inbox.try_recv() {
            self.queue_unbounded(note, None);
        }
        self.tracker.close();
        let finished = tokio::select! {
            finished = tokio::time::timeout_at(deadline, self.tracker.wait()) => finished.is_ok(),
            _ = hurry.cancelled() => false,
        };
        self.stop.cancel();
        if !finished {
            // Taken off their queues here, counted once: their workers find none left.
            let left = self.lock_queued().clear();
            let sending = self.lock().len();
            tracing::warn!(unaccounted = left, sending, flush = ?FLUSH, "stopping before every finished run was accounted for and told: the events accounted for wait in their jobs' records for the shard's leader or this node's next start");
            if left > 0 {
                crate::metrics::get()
                    .notifications
                    .get_or_create(&ResultLabel { result: "dropped" })
                    .inc_by(left as u64);
            }
        }
    }

    fn queue(self: &Arc<Self>, note: Note, room: tokio::sync::OwnedSemaphorePermit) {
        self.queue_unbounded(note, Some(room));
    }

    /// Queues `note` behind its job's others, starting the job's accounting task if none runs.
    fn queue_unbounded(self: &Arc<Self>, note: Note, room: Option<tokio::sync::OwnedSemaphorePermit>) {
        // The room is given back once the note is taken off its job's queue: `queued` then
        // holds at most the inbox's bound.
        if let Some(room) = room {
            room.forget();
        }
        let job = note.job().name.clone();
        if self.lock_queued().push(&job, note) {
            self.tracker.spawn(Arc::clone(self).account_job(job));
        }
    }

    /// Accounts for `job`'s queued runs one after the other, until none is left.
    async fn account_job(self: Arc<Self>, job: String) {
        loop {
            let Some(note) = self.lock_queued().next(&job) else {
                return;
            };
            self.room.add_permits(1);
            self.take(note).await;
        }
    }

    fn lock_queued(&self) -> std::sync::MutexGuard<'_, JobQueues<Note>> {
        self.queued.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Accounts for one run (or a takeover's missed ticks) and sends the events it adds.
    async fn take(self: &Arc<Self>, note: Note) {
        let (job, record) = match note {
            Note::Ran(job, record) => (job, record),
            Note::Missed {
                job,
                count,
                newest,
                fence,
            } => {
                let notifiers: Vec<&Notifier> = job.notify.iter().map(Arc::as_ref).collect();
                let (me, now) = (self.node_id.clone(), clock::now());
                let added = self
                    .account(&job, &clock::rfc3339(newest), |record| {
                        notify::account_missed(record, newest, count, fence, &notifiers, &me, now)
                    })
                    .await;
                self.deliver_all(&job, added);
                return;
            }
        };
        if job.notify.is_empty() {
            return;
        }
        let notifiers: Vec<&Notifier> = job.notify.iter().map(Arc::as_ref).collect();
        let (me, now) = (self.node_id.clone(), clock::now());
        let added = self
            .account(&job, &record.trigger.tick_shown(record.scheduled_at), |kept| {
                notify::account(kept, &record, &notifiers, &me, now)
            })
            .await;
        self.deliver_all(&job, added);
    }

    /// Changes the job's record by `change` (see [`notifications::account`]), trying again
    /// until [`DELIVERY_PATIENCE`] passed or the node stopped; the events it added. Only this
    /// job's later runs wait meanwhile.
    async fn account(
        &self,
        job: &Job,
        tick: &str,
        mut change: impl FnMut(&mut notify::Record) -> bool,
    ) -> Vec<Pending> {
        // Off the firing path, behind a bounded queue: worth waiting for etcd as long as an
        // event would be tried.
        let give_up = tokio::time::Instant::now() + DELIVERY_PATIENCE;
        let mut backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(30));
        while tokio::time::Instant::now() < give_up {
            let accounted = {
                // Held for the call only: a job whose record etcd refuses sleeps without it.
                let Ok(_call) = self.accounting.acquire().await else {
                    break;
                };
                notifications::account(&self.etcd, &self.keys, &job.name, &mut change).await
            };
            match accounted {
                Ok(added) => return added,
                Err(err) => {
                    tracing::warn!(job = %job.name, %tick, error = %err, "cannot account for the tick in the job's notification record; trying again")
                }
            }
            if !sleep_or_cancel(backoff.next_delay(), &self.stop).await {
                break;
            }
        }
        match self.stop.is_cancelled() {
            true => {
                tracing::warn!(job = %job.name, %tick, "stopped before the tick was accounted for in the job's notification record: a transition it made is not told")
            }
            false => {
                tracing::error!(job = %job.name, %tick, patience = ?DELIVERY_PATIENCE, "gave up accounting for the tick in the job's notification record: a transition it made is not told")
            }
        }
        count(&crate::metrics::get().notifications, "dropped");
        Vec::new()
    }

    /// Sends each of `pending` from a task of its own.
    pub(crate) fn deliver_all(self: &Arc<Self>, job: &Arc<Job>, pending: Vec<Pending>) {
        if self.http.is_none() {
            // Left in the record: they wait for a node that can send them (logged at the start).
            return;
        }
        for pending in pending {
            let Some(notifier) = job.notify.iter().find(|notifier| notifier.name == pending.notifier) else {
                tracing::warn!(job = %job.name, notifier = %pending.notifier, "an event waits for a notifier the job no longer lists: given up on");
                self.tracker
                    .spawn(Arc::clone(self).give_up(Arc::clone(job), pending, "gave_up"));
                continue;
            };
            let id = (
                job.name.clone(),
                pending.dedupe_key(&job.name),
                pending.notifier.clone(),
            );
            if !self.lock().insert(id.clone()) {
                continue;
            }
            let this = Arc::clone(self);
            let (job, notifier) = (Arc::clone(job), Arc::clone(notifier));
            self.tracker.spawn(async move {
                this.deliver(&job, &notifier, &pending).await;
                this.lock().remove(&id);
            });
        }
    }

    /// Whether this process is sending `pending` of `job` now.
    pub(crate) fn is_sending(&self, job: &str, pending: &Pending) -> bool {
        self.lock()
            .contains(&(job.to_string(), pending.dedupe_key(job), pending.notifier.clone()))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<(String, String, String)>> {
        self.sending.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(crate) fn etcd(&self) -> (&etcd_client::Client, &Keys) {
        (&self.etcd, &self.keys)
    }

    /// POSTs `pending` until the receiver takes it, or [`DELIVERY_PATIENCE`] after its run was
    /// accounted for; then takes it off the job's record.
    async fn deliver(&self, job: &Job, notifier: &Notifier, pending: &Pending) {
        let metrics = &crate::metrics::get().notifications;
        let span = tracing::info_span!("notify", job = %job.name, notifier = %notifier.name, event = pending.event.as_str(), tick = %pending.run.trigger.tick_shown(pending.run.scheduled_at), fence = pending.run.fence);
        let _entered = span.enter();
        // `since` comes from etcd: a far-future one must not overflow.
        let give_up_at = chrono::Duration::from_std(DELIVERY_PATIENCE)
            .ok()
            .and_then(|patience| pending.since.checked_add_signed(patience))
            .unwrap_or(DateTime::<Utc>::MAX_UTC);
        let mut backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(60));
        loop {
            // A node that took it over (this one seemed gone) sends it now: stop.
            match notifications::still_mine(&self.etcd, &self.keys, &job.name, pending, &self.node_id).await {
                Ok(false) => return,
                Ok(true) => {}
                Err(err) => tracing::debug!(error = %err, "cannot read the job's notification record; sending anyway"),
            }
            match self.post(job, notifier, pending).await {
                Ok(()) => {
                    count(metrics, "delivered");
                    tracing::info!(url = url_origin(&notifier.url), "notification delivered");
                    self.settle(job, pending, "delivered").await;
                    return;
                }
                Err(why) => {
                    count(metrics, "failed");
                    tracing::warn!(
                        url = url_origin(&notifier.url),
                        why,
                        "notification not delivered; trying again"
                    );
                }
            }
            let delay = backoff.next_delay();
            if clock::now() + chrono::Duration::from_std(delay).unwrap_or_default() > give_up_at {
                count(metrics, "gave_up");
                tracing::error!(url = url_origin(&notifier.url), patience = ?DELIVERY_PATIENCE, "notification given up on: not delivered in time");
                self.settle(job, pending, "gave_up").await;
                return;
            }
            if !sleep_or_cancel(delay, &self.stop).await {
                return;
            }
        }
    }

    async fn give_up(self: Arc<Self>, job: Arc<Job>, pending: Pending, result: &'static str) {
        count(&crate::metrics::get().notifications, result);
        self.settle(&job, &pending, result).await;
    }

    async fn settle(&self, job: &Job, pending: &Pending, result: &str) {
        let mut backoff = Backoff::coordination();
        for _ in 0..ACCOUNT_TRIES {
            match notifications::settle(&self.etcd, &self.keys, &job.name, pending, result, clock::now()).await {
                Ok(()) => return,
                Err(err) => {
                    tracing::warn!(error = %err, "cannot take the event off the job's notification record; trying again")
                }
            }
            if !sleep_or_cancel(backoff.next_delay(), &self.stop).await {
                return;
            }
        }
        tracing::error!("cannot take the event off the job's notification record: it may be sent again");
    }

    async fn post(&self, job: &Job, notifier: &Notifier, pending: &Pending) -> Result<(), String> {
        let body = Body::of(&job.name, pending);
        let body = serde_json::to_vec(&body).map_err(|err| format!("cannot write the body: {err}"))?;
        let http = self.http.as_ref().ok_or("this node has no webhook client")?;
        let mut request = http
            .post(&notifier.url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body);
        for (name, value) in &notifier.headers {
            request = request.header(name.as_str(), header_value(name, value).await?);
        }
        let answer = request.send().await.map_err(|err| describe(&err))?;
        match answer.status().is_success() {
            true => Ok(()),
            false => Err(format!("the receiver answered {}", answer.status())),
        }
    }
}

/// Pings `url` once for a success of `job`: failures are logged and counted, never retried
/// (the next success pings again).
async fn send_ping(http: reqwest::Client, stop: CancellationToken, job: String, url: String, method: PingMethod) {
    let pings = &crate::metrics::get().pings;
    let request = match method {
        PingMethod::Get => http.get(&url),
        PingMethod::Post => http.post(&url),
    };
    let sent = tokio::select! {
        sent = request.send() => sent,
        _ = stop.cancelled() => return,
    };
    match sent {
        Ok(answer) if answer.status().is_success() => count(pings, "delivered"),
        Ok(answer) => {
            count(pings, "failed");
            tracing::warn!(job, url = url_origin(&url), status = %answer.status(), "success ping refused");
        }
        Err(err) => {
            count(pings, "failed");
            tracing::warn!(
                job,
                url = url_origin(&url),
                why = describe(&err),
                "success ping not delivered"
            );
        }
    }
}

/// What went wrong, without the URL (which may hold a token) that reqwest's message names.
fn describe(err: &reqwest::Error) -> String {
    let what = if err.is_timeout() {
        "timed out"
    } else if err.is_connect() {
        "cannot connect"
    } else if err.is_request() {
        "the request failed"
    } else {
        "the exchange failed"
    };
    let mut cause = std::error::Error::source(err);
    let mut deepest = None;
    while let Some(next) = cause {
        deepest = Some(next.to_string());
        cause = next.source();
    }
    match deepest {
        Some(deepest) if !deepest.contains("://") => format!("{what}: {deepest}"),
        _ => what.to_string(),
    }
}

/// A header's value as it is sent; the error names the header and the variable or file, never
/// what they hold.
async fn header_value(name: &str, value: &HeaderValue) -> Result<reqwest::header::HeaderValue, String> {
    let text = match value {
        HeaderValue::Text(text) => text.clone(),
        HeaderValue::Env(variable) => std::env::var(variable)
            .map_err(|_| format!("header {name}: the environment variable {variable} is not set (or not UTF-8)"))?,
        HeaderValue::File(path) => header_file(path)
            .await
            .map_err(|why| format!("header {name}: {}: {why}", path.display()))?,
    };
    let mut value = reqwest::header::HeaderValue::from_str(&text)
        .map_err(|_| format!("header {name}: the value holds characters a header cannot carry"))?;
    value.set_sensitive(true);
    Ok(value)
}

/// A header file's text, its last newline cut: a private regular file (as `env_file` and the
/// tokens are), read off the runtime's workers. A FIFO is refused without blocking; a file
/// on a hung mount costs a blocking thread, not a worker, and the attempt ends after
/// [`SEND_TIMEOUT`].
async fn header_file(path: &std::path::Path) -> Result<String, String> {
    use crate::secrets::{read_private_file, PrivateFileError, NOT_GROUP_OR_OTHERS};
    let owned = path.to_path_buf();
    let read = tokio::task::spawn_blocking(move || read_private_file(&owned, MAX_HEADER_FILE, NOT_GROUP_OR_OTHERS));
    let bytes = match tokio::time::timeout(SEND_TIMEOUT, read).await {
        Err(_) => return Err(format!("not read within {SEND_TIMEOUT:?}")),
        Ok(Err(err)) => return Err(format!("the read failed: {err}")),
        Ok(Ok(Err(PrivateFileError::Read(err)))) => return Err(format!("cannot read it: {}", err.kind())),
        Ok(Ok(Err(PrivateFileError::TooLarge))) => {
            return Err(format!("larger than {MAX_HEADER_FILE} bytes"));
        }
        Ok(Ok(Err(refused))) => return Err(refused.to_string()),
        Ok(Ok(Ok(bytes))) => bytes,
    };
    let text = String::from_utf8(bytes).map_err(|_| "not UTF-8".to_string())?;
    Ok(text.trim_end_matches(['\n', '\r']).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn each_job_has_its_own_queue_and_keeps_its_order() {
        let mut queues = JobQueues::default();
        assert!(queues.push("stuck", 1), "a worker for stuck");
        assert!(!queues.push("stuck", 2), "behind stuck's first");
        assert!(queues.push("other", 10), "other waits for no one: a worker of its own");
        assert_eq!(queues.len(), 3);
        assert_eq!(queues.next("stuck"), Some(1));
        // stuck's worker is busy with 1 (etcd refusing its record): other's goes on.
        assert_eq!(queues.next("other"), Some(10));
        assert_eq!(queues.next("other"), None, "other's worker ends");
        assert!(queues.push("other", 11), "and the next of other starts another");
        assert!(!queues.push("stuck", 3));
        assert_eq!((queues.next("stuck"), queues.next("stuck")), (Some(2), Some(3)));
        assert_eq!(queues.next("stuck"), None);
        assert!(queues.push("stuck", 4));
        assert_eq!(queues.len(), 2);
    }

    #[tokio::test]
    async fn success_pings_past_the_bound_in_flight_are_dropped_and_counted() {
        // Takes connections into its backlog and never answers: each ping waits its timeout.
        let stalled = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/ping", stalled.local_addr().unwrap());
        let outbox = Outbox::unread();
        let dropped = || {
            crate::metrics::get()
                .pings
                .get_or_create(&ResultLabel { result: "dropped" })
                .get()
        };
        let before = dropped();
        for _ in 0..PINGS_IN_FLIGHT + 3 {
            outbox.ping("often", &url, PingMethod::Get);
        }
        assert_eq!(outbox.tracker.len(), PINGS_IN_FLIGHT);
        assert_eq!(dropped() - before, 3);
        outbox.stop.cancel();
        outbox.tracker.close();
        tokio::time::timeout(Duration::from_secs(5), outbox.tracker.wait())
            .await
            .expect("stopped pings end");
        outbox.ping("often", &url, PingMethod::Get);
        assert_eq!(dropped() - before, 3, "room again once they ended");
    }

    #[tokio::test]
    async fn a_header_file_must_be_a_private_regular_file() {
        let dir = tempfile::tempdir().unwrap();
        let private = dir.path().join("private");
        std::fs::write(&private, "Bearer t0ken\n").unwrap();
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o600)).unwrap();
        let value = header_value("Authorization", &HeaderValue::File(private))
            .await
            .unwrap();
        assert_eq!(value.to_str().unwrap(), "Bearer t0ken");

        let shared = dir.path().join("shared");
        std::fs::write(&shared, "Bearer t0ken").unwrap();
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = header_value("Authorization", &HeaderValue::File(shared.clone()))
            .await
            .unwrap_err();
        assert_eq!(
            err,
            format!(
                "header Authorization: {}: mode 0644 lets its group or others at it; `chmod 600` it",
                shared.display()
            )
        );
        assert!(!err.contains("t0ken"));

        let fifo = dir.path().join("fifo");
        let made = std::process::Command::new("mkfifo")
            .args(["-m", "600"])
            .arg(&fifo)
            .status()
            .expect("mkfifo");
        assert!(made.success());
        // No writer ever opens it: a blocking open would hang here.
        let err = tokio::time::timeout(
            Duration::from_secs(5),
            header_value("X-Key", &HeaderValue::File(fifo.clone())),
        )
        .await
        .expect("a FIFO is refused at once")
        .unwrap_err();
        assert_eq!(err, format!("header X-Key: {}: not a regular file", fifo.display()));
    }
}
