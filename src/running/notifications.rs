//! Telling people about runs: each finished run of a job with `notify` is accounted for in the
//! job's notification record, and the events it adds are POSTed to their notifiers with
//! retries; each success of a job with `ping_url` is pinged once.
//!
//! None of it is on the firing path: runs hand their records to a bounded queue and go on; the
//! node's one task accounts for them and sends each event from a task of its own.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

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

/// What runs hand over. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Outbox {
    sender: mpsc::Sender<Note>,
    http: reqwest::Client,
    shutdown: CancellationToken,
}

impl Outbox {
    /// An outbox nothing reads, for unit tests of runs of jobs with no one to tell.
    #[cfg(test)]
    pub(crate) fn unread() -> Outbox {
        Outbox {
            sender: mpsc::channel(1).0,
            http: reqwest::Client::new(),
            shutdown: CancellationToken::new(),
        }
    }

    /// Pings the job's `ping_url` for a success, and hands `record` over for its notifiers
    /// (with no more of its output than an event carries), if it has any.
    pub(crate) fn ran(&self, job: &Arc<Job>, record: &RunRecord) {
        if let Some(ping) = job.ping.as_ref().filter(|_| record.succeeded()) {
            let (http, shutdown) = (self.http.clone(), self.shutdown.clone());
            tokio::spawn(send_ping(
                http,
                shutdown,
                job.name.clone(),
                ping.url.clone(),
                ping.method,
            ));
        }
        if job.notify.is_empty() {
            return;
        }
        self.send(job, Note::Ran(Arc::clone(job), notify::kept(record)));
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
        if self.sender.try_send(note).is_err() {
            if let Some(left_out) = crate::repeats::log_now("notification queue full") {
                tracing::warn!(job = %job.name, left_out, "too many finished runs wait to be accounted for notifications: this one is dropped (left_out: lines like this one not logged since the last)");
            }
            count(&crate::metrics::get().notifications, "dropped");
        }
    }
}

/// The node's sender of notifications and pings.
pub(crate) struct Notifications {
    http: reqwest::Client,
    etcd: etcd_client::Client,
    keys: Keys,
    node_id: String,
    /// The events this process is sending now, by job and dedupe key and notifier: a sweep
    /// that finds them in etcd leaves them be.
    sending: Mutex<HashSet<(String, String, String)>>,
    shutdown: CancellationToken,
}

/// A queue for runs to hand their records to, and what reads it: run [`Notifications::run`].
pub(crate) fn new(
    etcd: etcd_client::Client,
    keys: Keys,
    node_id: String,
    shutdown: CancellationToken,
) -> (Outbox, Arc<Notifications>, mpsc::Receiver<Note>) {
    let (sender, inbox) = mpsc::channel(QUEUE);
    let http = reqwest::Client::builder()
        .timeout(SEND_TIMEOUT)
        .connect_timeout(SEND_TIMEOUT)
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!("shardcron/", env!("CARGO_PKG_VERSION")))
        .build()
        .unwrap_or_default();
    let notifications = Arc::new(Notifications {
        http,
        etcd,
        keys,
        node_id,
        sending: Mutex::default(),
        shutdown,
    });
    let outbox = Outbox {
        sender,
        http: notifications.http.clone(),
        shutdown: notifications.shutdown.clone(),
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
    /// Accounts for each run handed over until shutdown.
    pub(crate) async fn run(self: Arc<Self>, mut inbox: mpsc::Receiver<Note>) {
        loop {
            let note = tokio::select! {
                received = inbox.recv() => match received {
                    Some(received) => received,
                    None => return,
                },
                _ = self.shutdown.cancelled() => return,
            };
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
                        .account(&job, newest, |record| {
                            notify::account_missed(record, newest, count, fence, &notifiers, &me, now)
                        })
                        .await;
                    self.deliver_all(&job, added);
                    continue;
                }
            };
            if !job.notify.is_empty() {
                let notifiers: Vec<&Notifier> = job.notify.iter().map(Arc::as_ref).collect();
                let (me, now) = (self.node_id.clone(), clock::now());
                let added = self
                    .account(&job, record.scheduled_at, |kept| {
                        notify::account(kept, &record, &notifiers, &me, now)
                    })
                    .await;
                self.deliver_all(&job, added);
            }
        }
    }

    /// Changes the job's record by `change` (see [`notifications::account`]), trying again a
    /// few times; the events it added.
    async fn account(
        &self,
        job: &Job,
        tick: DateTime<Utc>,
        mut change: impl FnMut(&mut notify::Record) -> bool,
    ) -> Vec<Pending> {
        // Off the firing path, behind a bounded queue: worth waiting for etcd as long as an
        // event would be tried.
        let give_up = tokio::time::Instant::now() + DELIVERY_PATIENCE;
        let mut backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(30));
        while tokio::time::Instant::now() < give_up {
            match notifications::account(&self.etcd, &self.keys, &job.name, &mut change).await {
                Ok(added) => return added,
                Err(err) => {
                    tracing::warn!(job = %job.name, %tick, error = %err, "cannot account for the tick in the job's notification record; trying again")
                }
            }
            if !sleep_or_cancel(backoff.next_delay(), &self.shutdown).await {
                break;
            }
        }
        if !self.shutdown.is_cancelled() {
            tracing::error!(job = %job.name, %tick, patience = ?DELIVERY_PATIENCE, "gave up accounting for the tick in the job's notification record: a transition it made is not told");
            count(&crate::metrics::get().notifications, "dropped");
        }
        Vec::new()
    }

    /// Sends each of `pending` from a task of its own.
    pub(crate) fn deliver_all(self: &Arc<Self>, job: &Arc<Job>, pending: Vec<Pending>) {
        for pending in pending {
            let Some(notifier) = job.notify.iter().find(|notifier| notifier.name == pending.notifier) else {
                tracing::warn!(job = %job.name, notifier = %pending.notifier, "an event waits for a notifier the job no longer lists: given up on");
                tokio::spawn(Arc::clone(self).give_up(Arc::clone(job), pending, "gave_up"));
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
            tokio::spawn(async move {
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
        let span = tracing::info_span!("notify", job = %job.name, notifier = %notifier.name, event = pending.event.as_str(), tick = %pending.run.scheduled_at, fence = pending.run.fence);
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
            if !sleep_or_cancel(delay, &self.shutdown).await {
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
            if !sleep_or_cancel(backoff.next_delay(), &self.shutdown).await {
                return;
            }
        }
        tracing::error!("cannot take the event off the job's notification record: it may be sent again");
    }

    async fn post(&self, job: &Job, notifier: &Notifier, pending: &Pending) -> Result<(), String> {
        let body = Body::of(&job.name, pending);
        let body = serde_json::to_vec(&body).map_err(|err| format!("cannot write the body: {err}"))?;
        let mut request = self
            .http
            .post(&notifier.url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body);
        for (name, value) in &notifier.headers {
            request = request.header(name.as_str(), header_value(name, value)?);
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
async fn send_ping(http: reqwest::Client, shutdown: CancellationToken, job: String, url: String, method: PingMethod) {
    let pings = &crate::metrics::get().pings;
    let request = match method {
        PingMethod::Get => http.get(&url),
        PingMethod::Post => http.post(&url),
    };
    let sent = tokio::select! {
        sent = request.send() => sent,
        _ = shutdown.cancelled() => return,
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
fn header_value(name: &str, value: &HeaderValue) -> Result<reqwest::header::HeaderValue, String> {
    let text = match value {
        HeaderValue::Text(text) => text.clone(),
        HeaderValue::Env(variable) => std::env::var(variable)
            .map_err(|_| format!("header {name}: the environment variable {variable} is not set (or not UTF-8)"))?,
        HeaderValue::File(path) => {
            use std::io::Read;
            let mut text = String::new();
            std::fs::File::open(path)
                .and_then(|file| file.take(MAX_HEADER_FILE).read_to_string(&mut text))
                .map_err(|err| format!("header {name}: cannot read {}: {}", path.display(), err.kind()))?;
            text.trim_end_matches(['\n', '\r']).to_string()
        }
    };
    let mut value = reqwest::header::HeaderValue::from_str(&text)
        .map_err(|_| format!("header {name}: the value holds characters a header cannot carry"))?;
    value.set_sensitive(true);
    Ok(value)
}
