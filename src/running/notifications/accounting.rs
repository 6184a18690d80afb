//! How a note is accounted for: the node's one task hands each note, in order, to its job's
//! accounting task, which changes the job's notification record in etcd (trying again while
//! etcd refuses) and hands the events it added to delivery; and what a stop flushes.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::job_queues::JobQueues;
use super::{count, Note, Notifications, FLUSH};
use crate::backoff::{sleep_or_cancel, Backoff};
use crate::clock;
use crate::coord::notifications;
use crate::metrics::ResultLabel;
use crate::rules::config::Job;
use crate::rules::notify::{self, Notifier, Pending, DELIVERY_PATIENCE};

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
}
