//! How an event is sent: each from a task of its own, POSTed until the receiver takes it or its
//! patience ran out, then taken off the job's notification record; what this process is
//! sending now, so a sweep leaves it be.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::webhook::{describe, header_value};
use super::{count, Notifications};
use crate::backoff::{sleep_or_cancel, Backoff};
use crate::clock;
use crate::coord::keys::Keys;
use crate::coord::notifications;
use crate::rules::config::Job;
use crate::rules::notify::{url_origin, Body, Notifier, Pending, DELIVERY_PATIENCE};

/// How often an etcd call that accounts for a run is tried before the run is given up on.
const ACCOUNT_TRIES: u32 = 5;

impl Notifications {
    /// Sends each of `pending` from a task of its own.
    pub(super) fn deliver_all(self: &Arc<Self>, job: &Arc<Job>, pending: Vec<Pending>) {
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
    pub(super) fn is_sending(&self, job: &str, pending: &Pending) -> bool {
        self.lock()
            .contains(&(job.to_string(), pending.dedupe_key(job), pending.notifier.clone()))
    }

    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<(String, String, String)>> {
        self.sending.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(super) fn etcd(&self) -> (&etcd_client::Client, &Keys) {
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
