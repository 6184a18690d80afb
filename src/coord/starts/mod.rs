//! Which claimed ticks a leadership still owes, and which it has started since it last said so.
//!
//! A claim lists the tick it claims in the job's record as pending; the tick leaves the list once
//! it has started. A leader that dies, stalls or stops before a pending tick starts leaves it in
//! etcd, where the next leader finds it and delivers it (or records it lost, for at-most-once
//! jobs): a claimed tick never vanishes without a record. Starts are written lazily, riding in
//! the shard's next claim like results, so firing still costs about one etcd write per shard per
//! instant. A node also remembers the ticks it started until a record holds them, across
//! leaderships, so one that leads a shard again after losing its session (an etcd outage, a
//! stall) does not deliver again what it started itself: a start not yet written when its node
//! dies, or when another node takes the shard, is the only way a tick runs twice.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::coord::results::RIDE_WINDOW;
use crate::coord::session::Session;
use crate::rules::protocol::Owed;

mod here;

pub(crate) use here::StartedHere;

/// At most how much lease a start needs left: enough to write it. A third of the TTL is always
/// left between renewals that succeed, so this only holds back starts while renewals fail.
const START_MARGIN: Duration = Duration::from_secs(1);

/// How often a start held back for a renewal checks the lease again.
const MARGIN_POLL: Duration = Duration::from_millis(50);

/// The ticks one leadership of one shard owes, shared by its term and the runs it started.
pub(crate) struct Starts {
    /// Cancelled when the leadership ends: nothing it owes starts after that.
    leading: CancellationToken,
    session: Session,
    /// What the node started, for a later leadership of the same node to know.
    here: Arc<StartedHere>,
    state: Mutex<State>,
    started: Notify,
}

#[derive(Default)]
struct State {
    /// The ticks this leadership owes, by the protocol's rules.
    owed: Owed,
    /// Jobs whose owed ticks changed since their record was last written, and since when.
    unrecorded: HashMap<String, Instant>,
}

impl std::fmt::Debug for Starts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.lock();
        write!(f, "owing ticks of {} jobs", state.owed.owing_jobs().len())
    }
}

impl Starts {
    pub(crate) fn new(session: Session, leading: CancellationToken, here: Arc<StartedHere>) -> Starts {
        Starts {
            leading,
            session,
            here,
            state: Mutex::default(),
            started: Notify::new(),
        }
    }

    /// Cancelled when the leadership ends.
    pub(crate) fn leading(&self) -> &CancellationToken {
        &self.leading
    }

    /// Called before a claimed tick's command starts: a ticket to start it, if it may. It may
    /// while the leadership lasts, its lease holds by this node's own clock and the tick is
    /// still owed; this also waits until the lease has enough time left for the start to be
    /// written before it could expire, so a leader whose renewals are failing does not start a
    /// command that its successor would then run again. The tick stays listed as pending until
    /// [`StartTicket::started`]; a ticket dropped unused gives the tick back.
    pub(crate) async fn begin(self: &Arc<Self>, job: &str, tick: DateTime<Utc>) -> Option<StartTicket> {
        let margin = (self.session.ttl() / 3).min(START_MARGIN);
        loop {
            if self.leading.is_cancelled() || !self.session.check_live() {
                return None;
            }
            if self.session.remaining() >= margin {
                let fence = self.lock().owed.begin(job, tick)?;
                return Some(StartTicket {
                    starts: Arc::clone(self),
                    job: job.to_string(),
                    tick,
                    fence,
                    used: false,
                });
            }
            tracing::debug!(job, tick = %crate::clock::rfc3339(tick), left = ?self.session.remaining(), "waiting for a lease renewal before starting");
            tokio::select! {
                _ = tokio::time::sleep(MARGIN_POLL) => {}
                _ = self.leading.cancelled() => return None,
            }
        }
    }

    /// Called when a claimed tick is settled without a run (skipped, replaced): whether it may
    /// be, on the terms of [`Starts::begin`] but without waiting; the settlement is then kept for
    /// the leader to write like a start. A tick that may not stays pending in etcd.
    pub(crate) fn settle(&self, job: &str, tick: DateTime<Utc>) -> bool {
        let mut state = self.lock();
        if self.leading.is_cancelled() || !self.session.check_live() {
            return false;
        }
        let owed = state.owed.settle(job, tick);
        if owed {
            state.unrecorded.entry(job.to_string()).or_insert_with(Instant::now);
            drop(state);
            self.here.remember(job, tick);
            self.started.notify_waiters();
        }
        owed
    }

    /// A run of `job` about to start that the job's record must list as going (one that takes
    /// no ticket: a manual or backfill run): written like a start, but at once (riding the
    /// next claim only if one is being made), since the run starts once it is written.
    pub(crate) fn listed(&self, job: &str) {
        // Due at once: the run waits for the write that lists it.
        let due = Instant::now().checked_sub(RIDE_WINDOW).unwrap_or_else(Instant::now);
        let mut state = self.lock();
        let since = state.unrecorded.entry(job.to_string()).or_insert(due);
        *since = (*since).min(due);
        drop(state);
        self.started.notify_waiters();
    }

    /// What the node started, across its leaderships.
    pub(crate) fn here(&self) -> &StartedHere {
        &self.here
    }

    /// Whether a command of this leadership may start now (a first attempt with its ticket, or
    /// a retry): the leadership lasts and its lease holds by this node's own clock. Called with
    /// nothing between it and the spawn.
    pub(crate) fn may_spawn(&self) -> bool {
        !self.leading.is_cancelled() && self.session.check_live()
    }

    /// Until when, by this node's own monotonic clock, the lease holds: a command may be
    /// executed only before this instant.
    pub(crate) fn lease_deadline(&self) -> std::time::Instant {
        self.session.valid_until().into_std()
    }

    /// After a write of `job`'s record that won with `fence`: these ticks of `job` are owed.
    ///
    /// The write lists every tick still owed as this leadership's, so each of them starts with
    /// its fence: a tick claimed ahead before a redelivery's claim does not start after it with
    /// a lower fence, and a leadership starts a job's ticks in fence order.
    pub(crate) fn owe(&self, job: &str, ticks: impl IntoIterator<Item = DateTime<Utc>>, fence: i64) {
        self.lock().owed.owe(job, ticks, fence);
    }

    /// The fence of `tick` of `job` if this leadership owes it (claimed, not started).
    pub(crate) fn owed_fence(&self, job: &str, tick: DateTime<Utc>) -> Option<i64> {
        self.lock().owed.fence(job, tick)
    }

    /// The first tick of `job` after `after` that this leadership owes: one it claimed ahead.
    pub(crate) fn next_owed_after(&self, job: &str, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.lock().owed.next_after(job, after)
    }

    /// The ticks of `job` still owed, oldest first, those about to start included: what its
    /// record lists as pending.
    pub(crate) fn owed(&self, job: &str) -> BTreeSet<DateTime<Utc>> {
        self.lock().owed.listed(job)
    }

    /// Takes up to `max` jobs whose starts are not written yet, the oldest first, for a claim to
    /// write, skipping `except` (written anyway); [`Starts::unrecord`] puts back what could not
    /// be written.
    pub(crate) fn take_unrecorded(&self, max: usize, except: &[&str]) -> Vec<(String, Instant)> {
        let mut state = self.lock();
        let mut waiting: Vec<(&String, &Instant)> = state
            .unrecorded
            .iter()
            .filter(|(job, _)| !except.contains(&job.as_str()))
            .collect();
        if waiting.len() > max {
            waiting.select_nth_unstable_by_key(max, |(_, since)| **since);
            waiting.truncate(max);
        }
        let jobs: Vec<String> = waiting.into_iter().map(|(job, _)| job.clone()).collect();
        let mut taken: Vec<(String, Instant)> = jobs
            .into_iter()
            .filter_map(|job| state.unrecorded.remove_entry(&job))
            .collect();
        for job in except {
            if let Some(since) = state.unrecorded.remove(*job) {
                taken.push((job.to_string(), since));
            }
        }
        taken
    }

    /// Puts back jobs whose starts a failed claim did not write.
    pub(crate) fn unrecord(&self, jobs: Vec<(String, Instant)>) {
        let mut state = self.lock();
        for (job, since) in jobs {
            let at = state.unrecorded.entry(job).or_insert(since);
            *at = (*at).min(since);
        }
    }

    /// When the oldest start not yet written happened.
    pub(crate) fn oldest_unrecorded(&self) -> Option<Instant> {
        self.lock().unrecorded.values().min().copied()
    }

    /// Resolves once some start is not written yet.
    pub(crate) async fn any_unrecorded(&self) {
        self.until(|state| !state.unrecorded.is_empty()).await;
    }

    /// `tick` of `job`, owed and due, was adopted from an earlier leader that may have started
    /// it ([`Owed::adopted_maybe_started`]).
    pub(crate) fn adopted_maybe_started(&self, job: &str, tick: DateTime<Utc>) {
        self.lock().owed.adopted_maybe_started(job, tick);
    }

    /// `tick` of `job`, owed, may have started under an earlier leader.
    pub(crate) fn redeliver(&self, job: &str, tick: DateTime<Utc>) {
        self.lock().owed.redeliver(job, tick);
    }

    /// Whether a last write may mark `job`'s owed ticks released ([`Owed::releasable`]).
    pub(crate) fn releasable(&self, job: &str) -> bool {
        self.lock().owed.releasable(job)
    }

    /// Whether `tick` of `job` fires as a redelivery; asked once, when it fires.
    pub(crate) fn take_redelivery(&self, job: &str, tick: DateTime<Utc>) -> bool {
        self.lock().owed.take_redelivery(job, tick)
    }

    /// The jobs this leadership owes ticks of, those about to start included.
    pub(crate) fn owing_jobs(&self) -> Vec<String> {
        self.lock().owed.owing_jobs()
    }

    /// Resolves once one of `jobs` owes at most `limit` ticks, or the leadership ends.
    pub(crate) async fn owing_at_most(&self, limit: usize, jobs: Vec<String>) {
        self.until(|state| jobs.iter().any(|job| state.owed.count(job) <= limit))
            .await;
    }

    /// Resolves once every tick owed up to `tick` has started, or may no longer start.
    pub(crate) async fn all_begun(&self, tick: DateTime<Utc>) {
        self.until(|state| state.owed.all_begun(tick)).await;
    }

    /// Resolves once no ticket is between its last check and its spawn. Called after the
    /// leadership ended: a ticket that has not passed [`Starts::may_spawn`] gives its tick
    /// back, one that has is spawning and records its start, so the last write of starts then
    /// lists as pending exactly the ticks that never started.
    pub(crate) async fn spawns_settled(&self) {
        loop {
            let settled = self.started.notified();
            tokio::pin!(settled);
            settled.as_mut().enable();
            if self.lock().owed.none_starting() {
                return;
            }
            settled.await;
        }
    }

    async fn until(&self, done: impl Fn(&State) -> bool) {
        loop {
            // Registered before the check, so a start between the two is not missed.
            let started = self.started.notified();
            tokio::pin!(started);
            started.as_mut().enable();
            if done(&self.lock()) || self.leading.is_cancelled() {
                return;
            }
            tokio::select! {
                _ = started => {}
                _ = self.leading.cancelled() => return,
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Leave to start one claimed tick's command. Checked once more right before the command is
/// spawned, since the node may have been stopped since the ticket was given.
pub(crate) struct StartTicket {
    starts: Arc<Starts>,
    job: String,
    tick: DateTime<Utc>,
    fence: i64,
    used: bool,
}

impl StartTicket {
    /// The command was spawned (or failed to be): the start is kept for the leader to write.
    pub(crate) fn started(mut self) {
        self.used = true;
        let mut state = self.starts.lock();
        state.owed.started(&self.job, self.tick);
        state.unrecorded.entry(self.job.clone()).or_insert_with(Instant::now);
        drop(state);
        self.starts.here.remember(&self.job, self.tick);
        self.starts.started.notify_waiters();
    }
}

impl Drop for StartTicket {
    /// Unused, the tick is owed again: it stays pending for the next leader to deliver.
    fn drop(&mut self) {
        if self.used {
            return;
        }
        self.starts.lock().owed.give_back(&self.job, self.tick, self.fence);
        self.starts.started.notify_waiters();
    }
}
