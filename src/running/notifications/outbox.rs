//! What a run hands over: the outbox each finished run (and each takeover's missed ticks) is
//! given to, which pings a success and queues a note for the job's notifiers without waiting,
//! dropping (and counting) what a full or closed queue cannot take.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use tokio::sync::{mpsc, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::count;
#[cfg(test)]
use super::PINGS_IN_FLIGHT;
use crate::rules::config::Job;
use crate::rules::notify;
use crate::rules::record::RunRecord;

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
    pub(super) fn job(&self) -> &Arc<Job> {
        match self {
            Note::Ran(job, _) | Note::Missed { job, .. } => job,
        }
    }
}

/// What runs hand over. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Outbox {
    pub(super) sender: mpsc::Sender<Note>,
    /// `None`: the client could not be built, and nothing is told (logged once at the start).
    pub(super) http: Option<reqwest::Client>,
    pub(super) pings: Arc<Semaphore>,
    pub(super) tracker: TaskTracker,
    pub(super) stop: CancellationToken,
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
