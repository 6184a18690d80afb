//! The value of `/backfills/<job>` that the leaders serving a backfill share: which ticks are
//! claimed, which are going on where, how many are done, which go again, and whether it was
//! cancelled.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::ask::{Ask, MAX_PARALLEL};
use crate::rules::config::Job;
use crate::rules::plan::{self, Fire};

/// A tick a leader claimed and whose run has not been counted yet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InFlight {
    pub tick: DateTime<Utc>,
    pub node: String,
    /// The term of the leadership that claimed it.
    pub term: i64,
    /// Claimed again after its node went while it was in flight: it may have run.
    #[serde(default)]
    pub redelivered: bool,
    /// This claim's own id: a tick given back may be claimed again, on the same node too, and a
    /// late count or give-back of the earlier claim must not settle the later one.
    #[serde(default)]
    pub claim: String,
    /// The lease its node keeps while its runs go on (the node's slot lease), and that lists
    /// the run as going: the tick is an orphan once this lease is gone, not once its node left
    /// the fleet's members (a node stopping with a shutdown grace leaves them while its runs go
    /// on). Absent in records of releases before it: membership decides those.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<i64>,
}

/// A tick given back to be claimed again, before the ticks not claimed yet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Again {
    pub tick: DateTime<Utc>,
    /// It was in flight on a node that went: it may have run (`CRON_REDELIVERED`).
    pub redelivered: bool,
}

/// The next tick a leader may claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Next {
    pub tick: DateTime<Utc>,
    pub redelivered: bool,
}

/// The value of `/backfills/<job>`: a few hundred bytes whatever the range (a leader works out
/// each next tick from the job's schedule), since every claim writes it whole.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Backfill {
    pub id: String,
    pub requested_at: DateTime<Utc>,
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    /// The ticks of the schedule in `[from, to)` when it was asked for.
    pub total: usize,
    pub parallel: u32,
    /// How many ticks were claimed a first time.
    pub claimed: usize,
    /// The newest tick claimed a first time: the next is the schedule's first after it.
    pub cursor: Option<DateTime<Utc>>,
    /// Ticks whose run ended (and at-most-once ticks recorded lost).
    pub done: usize,
    /// Of `done`, the at-most-once ticks recorded lost: their node went while they were in
    /// flight.
    #[serde(default)]
    pub lost: usize,
    pub in_flight: Vec<InFlight>,
    /// Given back, claimed before `ticks[next]`, oldest first.
    #[serde(default)]
    pub again: Vec<Again>,
    pub cancelled: bool,
}

impl Backfill {
    pub fn new(id: String, ask: &Ask, fires: &[Fire], now: DateTime<Utc>) -> Backfill {
        Backfill {
            id,
            requested_at: now,
            from: ask.from,
            to: ask.to,
            total: fires.len(),
            parallel: ask.parallel,
            claimed: 0,
            cursor: None,
            done: 0,
            lost: 0,
            in_flight: Vec::new(),
            again: Vec::new(),
            cancelled: false,
        }
    }

    /// The first tick of `job`'s schedule not claimed yet, if one is left in the range.
    fn unclaimed(&self, job: &Job) -> Option<DateTime<Utc>> {
        if self.claimed >= self.total {
            return None;
        }
        let tick = match self.cursor {
            Some(cursor) => job.schedule.next_after(cursor)?,
            None => plan::fires(&[job], self.from, self.to, 1).0.first()?.at,
        };
        (tick < self.to).then_some(tick)
    }

    /// The next tick to claim, if one may be claimed now: not once cancelled or all claimed,
    /// nor while `parallel` are in flight. Ticks given back come first.
    pub fn next_claim(&self, job: &Job) -> Option<Next> {
        // Bounded again here: the record comes from etcd.
        let parallel = self.parallel.clamp(1, MAX_PARALLEL) as usize;
        if self.cancelled || self.in_flight.len() >= parallel {
            return None;
        }
        if let Some(again) = self.again.first() {
            return Some(Next {
                tick: again.tick,
                redelivered: again.redelivered,
            });
        }
        self.unclaimed(job).map(|tick| Next {
            tick,
            redelivered: false,
        })
    }

    /// Whether the schedule now has fewer ticks in the range than when the backfill was asked
    /// for (a reload changed it) and all it has were claimed: the total is cut to them.
    pub fn ran_out(&mut self, job: &Job) -> bool {
        let out = self.claimed < self.total && self.unclaimed(job).is_none();
        if out {
            self.total = self.claimed;
        }
        out
    }

    /// `next`, the one [`Backfill::next_claim`] gave, claimed by the leadership of `term` on
    /// `node` as claim `claim` (an id of [`new_id`]).
    pub fn claim(&mut self, next: Next, node: &str, term: i64, claim: &str, lease: Option<i64>) {
        if self.again.first().is_some_and(|again| again.tick == next.tick) {
            self.again.remove(0);
        } else if self.cursor.is_none_or(|cursor| cursor < next.tick) && self.claimed < self.total {
            self.cursor = Some(next.tick);
            self.claimed += 1;
        } else {
            return;
        }
        self.in_flight.push(InFlight {
            tick: next.tick,
            node: node.to_string(),
            term,
            redelivered: next.redelivered,
            claim: claim.to_string(),
            lease,
        });
    }

    fn take_in_flight(&mut self, tick: DateTime<Utc>, claim: &str) -> Option<InFlight> {
        let at = self
            .in_flight
            .iter()
            .position(|flight| flight.tick == tick && flight.claim == claim)?;
        Some(self.in_flight.remove(at))
    }

    /// The run of `tick` by claim `claim` ended and was recorded: it is done. False if that
    /// claim is not in flight (counted already, or settled as its node's orphan).
    pub fn finish(&mut self, tick: DateTime<Utc>, claim: &str) -> bool {
        let finished = self.take_in_flight(tick, claim).is_some();
        if finished {
            self.done += 1;
        }
        finished
    }

    /// `tick`, in flight by claim `claim`, is to be claimed again: it did not start (a pause
    /// came, the leadership ended first), or `redelivered`: its node went and it may have run.
    pub fn give_back(&mut self, tick: DateTime<Utc>, claim: &str, redelivered: bool) -> bool {
        let Some(flight) = self.take_in_flight(tick, claim) else {
            return false;
        };
        let again = Again {
            tick,
            redelivered: redelivered || flight.redelivered,
        };
        let at = self.again.partition_point(|other| other.tick < tick);
        self.again.insert(at, again);
        true
    }

    /// `tick`, in flight by claim `claim` when its node went, is recorded lost (an at-most-once
    /// job): counted done, never run again.
    pub fn record_lost(&mut self, tick: DateTime<Utc>, claim: &str) -> bool {
        let lost = self.take_in_flight(tick, claim).is_some();
        if lost {
            self.done += 1;
            self.lost += 1;
        }
        lost
    }

    /// The ticks in flight that `orphaned` says will never be counted by their node.
    pub fn orphans(&self, orphaned: impl Fn(&InFlight) -> bool) -> Vec<InFlight> {
        self.in_flight
            .iter()
            .filter(|flight| orphaned(flight))
            .cloned()
            .collect()
    }

    /// Nothing is left to run or waited for: all done, or cancelled with none in flight.
    pub fn is_over(&self) -> bool {
        self.in_flight.is_empty() && (self.cancelled || (self.claimed >= self.total && self.again.is_empty()))
    }

    /// Done, and how many ticks in all.
    pub fn progress(&self) -> (usize, usize) {
        (self.done, self.total)
    }
}
