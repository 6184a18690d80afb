//! What a new leader does first: the ticks its predecessor claimed and never started, and the
//! ticks missed while the shard had no leader.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

use chrono::{DateTime, Utc};

use super::Term;
use crate::clock;
use crate::coord::claims::{Book, Claimer, Halt};
use crate::coord::etcd::ops_per_txn;
use crate::coord::view::FleetView;
use crate::rules::catch_up::{any_due_since, misses_any, MAX_CATCH_UP};
use crate::rules::config::Job;
use crate::rules::protocol::takeover::{self, Known, Leader, Plan};
use crate::rules::protocol::write::Won;
use crate::rules::protocol::{Owner, Want};
use crate::rules::record::{Claim, Debt, Outcome, RunRecord, Trigger};
use crate::running::runner::Arrival;

/// Per job (by index in the book): the revision of the record that listed them, and the pending
/// ticks of earlier leaders this one records lost, with the leader that owed each.
type Lost = HashMap<usize, (i64, Vec<(Debt, Vec<DateTime<Utc>>)>)>;

/// Per job (by index in the book): the adopted ticks an earlier leader released, which never
/// started; the other adopted ticks may have, and run as redeliveries.
type NeverStarted = HashMap<usize, BTreeSet<DateTime<Utc>>>;

impl Term {
    /// Settles, for the jobs of `behind` (front first), what earlier leaders left: ticks they
    /// claimed and never started are delivered again or recorded lost, as each job's `delivery`
    /// says, and the ticks missed before `took_over` (the takeover, or the end of a stall) run
    /// as each job's `catch_up` says. Returns the jobs settled, which fire from now on. A job
    /// that owes late runs while the node has no room for more of them (see
    /// `running::runs::late::LATE_ROOM`) stays in `behind` until the leader has room to claim it; its
    /// ticks due meanwhile join its backlog, every one of them ([`crate::rules::catch_up::due_since`]).
    /// A job may owe at most [`crate::rules::catch_up::MAX_OWED`] ticks at once: one whose backlog is
    /// longer is claimed in part and joins `refilling`, to claim the rest as its ticks start.
    pub(super) async fn catch_up(
        &self,
        claimer: &Claimer<'_>,
        book: &mut Book,
        behind: &mut VecDeque<usize>,
        refilling: &mut Vec<usize>,
        took_over: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<Vec<usize>, Halt> {
        // A transaction's worth of jobs at a time, yielding between them: a shard of 100,000
        // jobs with missed ticks never holds every job's ticks at once, nor a worker for long.
        let mut settled = Vec::new();
        let mut waiting = VecDeque::new();
        while !behind.is_empty() {
            let chunk: Vec<usize> = behind.drain(..behind.len().min(ops_per_txn())).collect();
            claimer.read(book, chunk.iter().copied()).await?;
            if !self.work.runs.has_late_room() {
                // Working out ticks there is no room to claim would only keep the workers from
                // the claims that have room: the jobs that owe nothing fire from now on, the
                // others wait.
                for index in chunk {
                    if self.may_owe(book, index, took_over, now) {
                        waiting.push_back(index);
                    } else {
                        settled.push(index);
                    }
                }
                tokio::task::yield_now().await;
                continue;
            }
            let (wants, lost, never_started, unfinished) = self.wants(book, &chunk, took_over, now);
            let late: usize = wants.iter().map(|want| want.fresh.len() + want.adopt.len()).sum();
            let room = if wants.is_empty() {
                None
            } else {
                self.work.runs.reserve_late(late)
            };
            if !wants.is_empty() && room.is_none() {
                let owing: Vec<usize> = wants.iter().map(|want| want.index).collect();
                settled.extend(chunk.iter().filter(|index| !owing.contains(index)));
                waiting.extend(owing);
                tokio::task::yield_now().await;
                continue;
            }
            if !wants.is_empty() {
                self.deliver(claimer, book, &wants, (lost, never_started), now).await?;
            }
            drop(room);
            settled.extend(chunk.iter().filter(|index| !unfinished.contains(index)));
            refilling.extend(unfinished);
            tokio::task::yield_now().await;
        }
        if !waiting.is_empty() {
            tracing::info!(jobs = waiting.len(), "the node has no room for more late runs: these jobs' backlogs are claimed once earlier ones have started");
        }
        *behind = waiting;
        Ok(settled)
    }

    /// Whether [`Self::wants`] may ask anything for the job at `index`, found without working
    /// out its ticks; true when in doubt.
    fn may_owe(&self, book: &Book, index: usize, took_over: DateTime<Utc>, now: DateTime<Utc>) -> bool {
        let entry = &book.entries()[index];
        !self.settleable(entry.record(), &self.fleet.borrow()).is_empty()
            || misses_any(&entry.job, entry.last(), took_over)
            || any_due_since(&entry.job, entry.last(), took_over, now)
    }

    /// The debts `record` lists that this leader settles ([`takeover::settleable`]).
    fn settleable(&self, record: Option<&Claim>, view: &FleetView) -> Vec<Debt> {
        takeover::settleable(record, &self.leader(), |pool, shards| view.family_gone(pool, shards))
    }

    fn leader(&self) -> Leader<'_> {
        Leader {
            term: self.leadership.term,
            node: &self.identity.node_id,
            pool: self.leadership.pool.as_deref(),
            shards: self.leadership.shards,
        }
    }

    /// What to claim for `jobs` ([`takeover::plan`]): ticks missed before `took_over` as each
    /// job's `catch_up` says, every tick due since, and the pending ticks earlier leaders left,
    /// to run again or (returned apart) to record lost. Also returned: the jobs whose backlog is
    /// claimed only in part, as they may owe no more at once.
    fn wants(
        &self,
        book: &Book,
        jobs: &[usize],
        took_over: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> (Vec<Want>, Lost, NeverStarted, Vec<usize>) {
        let mut wants = Vec::new();
        let mut lost = Lost::new();
        let mut never_started = NeverStarted::new();
        let mut unfinished = Vec::new();
        let view = self.fleet.borrow().clone();
        let leader = self.leader();
        for &index in jobs {
            let entry = &book.entries()[index];
            let job = &entry.job;
            let plan = takeover::plan(
                &leader,
                &Known {
                    index,
                    job,
                    record: entry.record(),
                    owed: self.starts.owed(&job.name).len(),
                    started_here: &|tick| self.work.started_here.contains(&job.name, tick),
                    gone: &|pool, shards| view.family_gone(pool, shards),
                    took_over,
                    now,
                },
            );
            log_plan(job, &plan, &self.leader());
            if let Some((count, newest)) = plan.left_out {
                // Fenced by the record read: a leader that read the same record and tells the
                // same ticks again is not counted twice (see `notify::account`).
                self.work.reports.missed(job, count, newest, entry.revision());
            }
            if plan.unfinished {
                unfinished.push(index);
            }
            if !plan.never_started.is_empty() {
                never_started.insert(index, plan.never_started);
            }
            let dropped: Vec<(Debt, Vec<DateTime<Utc>>)> = plan
                .settled
                .into_iter()
                .filter(|settled| !settled.lost.is_empty())
                .map(|settled| (settled.debt, settled.lost))
                .collect();
            if !dropped.is_empty() {
                lost.insert(index, (entry.revision(), dropped));
            }
            wants.extend(plan.want);
        }
        (wants, lost, never_started, unfinished)
    }

    /// Claims `wants` (one transaction's worth) and starts what they won.
    async fn deliver(
        &self,
        claimer: &Claimer<'_>,
        book: &mut Book,
        wants: &[Want],
        (mut lost, mut never_started): (Lost, NeverStarted),
        now: DateTime<Utc>,
    ) -> Result<(), Halt> {
        // Recorded before the claim drops them from the records: see `ResultQueue::write_now`.
        // One write for every job of the chunk, not a round trip per job.
        let mut recorded: HashMap<usize, _> = lost
            .drain()
            .map(|(index, (listed_at, debts))| {
                let records: Vec<RunRecord> = debts
                    .iter()
                    .flat_map(|(debt, ticks)| lost_records(debt, listed_at, ticks))
                    .collect();
                (index, (debts, records))
            })
            .collect();
        if !recorded.is_empty() {
            let client = self.session.client();
            let writes: Vec<(&Job, &[RunRecord])> = recorded
                .iter()
                .map(|(index, (_, records))| (book.job(*index).as_ref(), records.as_slice()))
                .collect();
            claimer
                .retry(|| self.work.results.write_now(&client, &self.identity.keys, &writes))
                .await?;
        }
        for won in claimer.claim(book, wants).await? {
            if let Some((debts, records)) = recorded.remove(&won.index) {
                self.recorded_lost(book.job(won.index), &won, &debts, &records);
            }
            let never_started = never_started.remove(&won.index).unwrap_or_default();
            self.start_won(book, &won, &never_started, now);
        }
        Ok(())
    }

    /// Logs and reports the ticks of `job` its earlier leaders claimed and never started, which
    /// `won` settles as lost (written before the claim).
    fn recorded_lost(&self, job: &Arc<Job>, won: &Won, debts: &[(Debt, Vec<DateTime<Utc>>)], records: &[RunRecord]) {
        for (debt, ticks) in debts.iter().filter(|(debt, _)| won.settles.contains(&Owner::of(debt))) {
            for tick in ticks {
                tracing::warn!(job = %job.name, tick = %crate::clock::rfc3339(*tick), term = debt.term, node = %debt.node, delivery = ?job.delivery, "lost: a tick its leader claimed and never started, not run again");
            }
        }
        for record in records {
            self.work.reports.recorded_lost(job, record);
        }
    }

    /// Starts what `won` delivers of its job: the ticks an earlier leader claimed (redelivered,
    /// or caught up if they never started) and the missed ones it claimed fresh; an adopted tick
    /// not due yet is owed and fires on time.
    fn start_won(&self, book: &Book, won: &Won, never_started: &BTreeSet<DateTime<Utc>>, now: DateTime<Utc>) {
        let job = book.job(won.index);
        // An earlier leader's tick that is not due yet is owed now and fires on time from
        // the queue; unless that leader released it, its clock may have run ahead of ours
        // and started it, so it runs as a redelivery.
        let (adopted, not_due): (Vec<DateTime<Utc>>, Vec<DateTime<Utc>>) =
            won.adopt.iter().partition(|tick| **tick <= now);
        for tick in not_due.iter().filter(|tick| !never_started.contains(tick)) {
            self.starts.redeliver(&job.name, *tick);
        }
        for tick in adopted.iter().filter(|tick| !never_started.contains(tick)) {
            self.starts.adopted_maybe_started(&job.name, *tick);
        }
        if won.fresh.is_empty() && adopted.is_empty() {
            return;
        }
        let mut ticks: Vec<(DateTime<Utc>, Arrival)> = adopted
            .iter()
            .map(|tick| {
                let arrival = if never_started.contains(tick) {
                    Arrival::CaughtUp
                } else {
                    Arrival::Redelivered
                };
                (*tick, arrival)
            })
            .chain(won.fresh.iter().map(|tick| (*tick, Arrival::CaughtUp)))
            .collect();
        // A tick both owed and missed runs caught up, not flagged redelivered.
        ticks.sort_by_key(|(tick, arrival)| (*tick, *arrival == Arrival::Redelivered));
        ticks.dedup_by_key(|(tick, _)| *tick);
        if let Some(first) = adopted.first() {
            tracing::warn!(job = %job.name, ticks = adopted.len(), first = %crate::clock::rfc3339(*first), "delivering again ticks that an earlier leader claimed and whose start it never recorded");
        }
        if !won.fresh.is_empty() {
            tracing::info!(job = %job.name, ticks = won.fresh.len(), first = %crate::clock::rfc3339(won.fresh[0]), policy = ?job.catch_up, "catching up missed ticks");
            crate::metrics::get().catch_up_runs.inc_by(won.fresh.len() as u64);
        }
        self.work.runs.start(
            ticks
                .into_iter()
                .map(|(tick, arrival)| self.tick(book, won.index, tick, won.fence, arrival))
                .collect(),
        );
    }
}

/// The records of ticks an earlier leader claimed and never started, which this one does not
/// run. Their fence is the revision of the record that listed them: no earlier than their claim,
/// and earlier than any claim of this leader.
fn lost_records(debt: &Debt, listed_at: i64, ticks: &[DateTime<Utc>]) -> Vec<RunRecord> {
    ticks
        .iter()
        .map(|tick| RunRecord {
            scheduled_at: *tick,
            fence: listed_at,
            node: debt.node.clone(),
            outcome: Outcome::Lost,
            exit_code: None,
            duration_ms: 0,
            finished_at: clock::now(),
            attempts: 0,
            trigger: Trigger::Schedule,
            output: None,
            blackout: None,
        })
        .collect()
}

/// Logs what a takeover found for `job` beyond the ticks it claims.
fn log_plan(job: &Job, plan: &Plan, leader: &Leader) {
    if let Some(was) = &plan.schedule_was {
        tracing::info!(job = %job.name, was, now = %job.schedule.label(), "the schedule changed since the last claim: the ticks the new one would have had before now never existed, none is caught up");
    }
    if plan.truncated {
        tracing::warn!(job = %job.name, kept = MAX_CATCH_UP, "more ticks were missed than one takeover catches up: running only the newest");
    }
    for settled in &plan.settled {
        let debt = &settled.debt;
        if let Some(first) = settled.started_here.first() {
            tracing::info!(job = %job.name, ticks = settled.started_here.len(), first = %crate::clock::rfc3339(*first), term = debt.term, "ticks this node started in an earlier leadership, whose start that one could not write: recorded now, not run again");
        }
        if debt
            .shards
            .is_some_and(|owner| owner != leader.shards || debt.pool.as_deref() != leader.pool)
        {
            tracing::info!(job = %job.name, ticks = debt.pending.len(), node = %debt.node, term = debt.term, shards = %debt.shards.map_or_else(|| "-".to_owned(), |shards| shards.to_string()), pool = %debt.pool.as_deref().unwrap_or("-"), "settling the pending ticks of a leader of an election family (pool, shard count) no node runs any more");
        }
    }
}
