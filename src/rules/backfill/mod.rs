//! Backfill: every tick of a job's schedule in a past range run again, oldest first, through
//! the leader of the job's shard. What may be asked (a past range of at most `max` ticks), and
//! the record in etcd that the leaders serving it share: which ticks are claimed, which are
//! going on where, how many are done, which go again, and whether it was cancelled. Pure: the
//! caller passes the clock's reading and which nodes went.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::rules::config::Job;
use crate::rules::plan::{self, Fire};
use crate::rules::record::Trigger;

/// The most ticks one backfill runs unless `--max` says more.
pub const DEFAULT_MAX: usize = 1000;

/// The most `--max` may allow.
pub const MAX_TICKS: usize = 100_000;

/// The most backfill runs of a job at once (`--parallel`).
pub const MAX_PARALLEL: u32 = 64;

/// Why a backfill is refused before anything is written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("--from {} is not before --to {}", shown(.from), shown(.to))]
    EmptyRange { from: DateTime<Utc>, to: DateTime<Utc> },
    #[error("the range ends at {}, in the future (now {}): a backfill runs past ticks only; the schedule runs the rest", shown(.to), shown(.now))]
    InTheFuture { to: DateTime<Utc>, now: DateTime<Utc> },
    #[error(
        "the range holds more than {max} ticks of the job's schedule: narrow it, or raise --max (at most {MAX_TICKS})"
    )]
    TooMany { max: usize },
    #[error("the range holds no tick of the job's schedule")]
    NoTick,
    #[error("--max must be 1 to {MAX_TICKS}")]
    Max,
    #[error("--parallel must be 1 to {MAX_PARALLEL}")]
    Parallel,
}

/// An instant of a refusal as a backfill's ticks are shown (the rules may not import `clock`):
/// to the second, since the ticks a range holds are whole seconds.
fn shown(at: &DateTime<Utc>) -> String {
    Trigger::Backfill.tick_shown(*at)
}

/// What an operator asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ask {
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    pub max: usize,
    pub parallel: u32,
}

/// The ticks of `job`'s schedule in `[from, to)`, oldest first, with their DST notes as `plan`
/// prints them; refused if the range is not wholly past at `now`, or holds none or too many.
pub fn ticks<'a>(job: &'a Job, ask: &Ask, now: DateTime<Utc>) -> Result<Vec<Fire<'a>>, Refused> {
    if !(1..=MAX_TICKS).contains(&ask.max) {
        return Err(Refused::Max);
    }
    if !(1..=MAX_PARALLEL).contains(&ask.parallel) {
        return Err(Refused::Parallel);
    }
    if ask.from >= ask.to {
        return Err(Refused::EmptyRange {
            from: ask.from,
            to: ask.to,
        });
    }
    if ask.to > now {
        return Err(Refused::InTheFuture { to: ask.to, now });
    }
    let (fires, cut) = plan::fires(&[job], ask.from, ask.to, ask.max);
    if cut {
        return Err(Refused::TooMany { max: ask.max });
    }
    if fires.is_empty() {
        return Err(Refused::NoTick);
    }
    Ok(fires)
}

/// A new backfill's id: what its runs count their ticks in, so that a run of a cancelled
/// backfill never counts in the next one.
pub fn new_id() -> String {
    format!("{:016x}", rand::random::<u64>())
}

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

#[cfg(test)]
mod tests {
    use chrono::{DateTime, Utc};

    use super::{ticks, Ask, Backfill, Refused};
    use crate::rules::config::Job;

    fn at(minute: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + minute * 60, 0).unwrap_or_default()
    }

    fn ask(from: i64, to: i64) -> Ask {
        Ask {
            from: at(from),
            to: at(to),
            max: 1000,
            parallel: 1,
        }
    }

    #[test]
    fn the_ticks_of_a_past_range_oldest_first() {
        let job = Job::for_tests("report", "* * * * *");
        let fires = ticks(&job, &ask(0, 20), at(30)).expect("twenty ticks");
        let ticks: Vec<DateTime<Utc>> = fires.iter().map(|fire| fire.at).collect();
        assert_eq!(ticks, (0..20).map(at).collect::<Vec<_>>(), "from included, to excluded");
    }

    #[test]
    fn refusals() {
        let job = Job::for_tests("report", "* * * * *");
        let yearly = Job::for_tests("yearly", "0 0 1 1 *");
        let cases = [
            (
                &job,
                ask(10, 10),
                Refused::EmptyRange {
                    from: at(10),
                    to: at(10),
                },
            ),
            (
                &job,
                ask(0, 40),
                Refused::InTheFuture {
                    to: at(40),
                    now: at(30),
                },
            ),
            (&job, Ask { max: 5, ..ask(0, 20) }, Refused::TooMany { max: 5 }),
            (&yearly, ask(0, 20), Refused::NoTick),
            (&job, Ask { max: 0, ..ask(0, 20) }, Refused::Max),
            (
                &job,
                Ask {
                    parallel: 0,
                    ..ask(0, 20)
                },
                Refused::Parallel,
            ),
        ];
        for (job, ask, refused) in cases {
            assert_eq!(ticks(job, &ask, at(30)).map(|fires| fires.len()), Err(refused));
        }
        assert_eq!(
            ticks(&job, &Ask { max: 20, ..ask(0, 20) }, at(30)).map(|fires| fires.len()),
            Ok(20)
        );
        assert_eq!(
            Refused::EmptyRange {
                from: at(10),
                to: at(10)
            }
            .to_string(),
            "--from 2027-01-15T08:10:00Z is not before --to 2027-01-15T08:10:00Z"
        );
    }

    /// A per-minute job's backfill of 4 ticks, 2 at a time.
    fn four_ticks_two_at_a_time() -> (Job, Backfill) {
        let job = Job::for_tests("report", "* * * * *");
        let ask = Ask {
            parallel: 2,
            ..ask(0, 4)
        };
        let fires = ticks(&job, &ask, at(30)).expect("ticks");
        let backfill = Backfill::new("b1".into(), &ask, &fires, at(30));
        (job, backfill)
    }

    #[test]
    fn claims_go_in_order_at_most_parallel_at_once_until_cancelled() {
        let (job, mut backfill) = four_ticks_two_at_a_time();
        for expected in [at(0), at(1)] {
            let next = backfill.next_claim(&job).expect("a tick to claim");
            assert_eq!(next.tick, expected);
            backfill.claim(next, "a", 7, &format!("a{}", next.tick), None);
        }
        assert_eq!(backfill.next_claim(&job), None, "two in flight");
        assert!(backfill.finish(at(1), &format!("a{}", at(1))));
        assert!(!backfill.finish(at(1), &format!("a{}", at(1))), "counted once");
        assert_eq!(backfill.next_claim(&job).map(|next| next.tick), Some(at(2)));
        backfill.cancelled = true;
        assert_eq!(backfill.next_claim(&job), None);
        assert!(!backfill.is_over(), "a tick still in flight");
        assert!(backfill.finish(at(0), &format!("a{}", at(0))));
        assert!(backfill.is_over());
        assert_eq!(backfill.progress(), (2, 4));
    }

    #[test]
    fn a_gone_nodes_ticks_go_back_first_flagged_or_are_recorded_lost() {
        let (job, mut backfill) = four_ticks_two_at_a_time();
        for node in ["a", "b"] {
            let next = backfill.next_claim(&job).expect("a tick");
            backfill.claim(next, node, 7, node, None);
        }
        let orphans = backfill.orphans(|flight| flight.node == "a");
        assert_eq!(orphans.len(), 1);
        assert_eq!(orphans[0].tick, at(0));
        assert!(backfill.give_back(at(0), "a", true));
        assert!(!backfill.give_back(at(0), "a", true), "once");
        assert!(!backfill.finish(at(0), "a"), "its node's late end counts nothing");
        let next = backfill.next_claim(&job).expect("the given back tick first");
        assert_eq!((next.tick, next.redelivered), (at(0), true));
        backfill.claim(next, "a", 9, "a-again", None);
        assert!(
            !backfill.finish(at(0), "a"),
            "the earlier claim's late count settles nothing"
        );
        assert!(backfill.record_lost(at(1), "b"));
        let next = backfill.next_claim(&job).expect("then the next unclaimed tick");
        assert_eq!((next.tick, next.redelivered), (at(2), false));
        assert!(backfill.finish(at(0), "a-again"));
        assert_eq!(backfill.progress(), (2, 4));
        assert_eq!(backfill.lost, 1);
        assert!(!backfill.is_over());
    }

    #[test]
    fn a_schedule_with_fewer_ticks_after_a_reload_ends_the_backfill_with_those_it_has() {
        let job = Job::for_tests("report", "* * * * *");
        let ask = ask(0, 4);
        let fires = ticks(&job, &ask, at(30)).expect("ticks");
        let mut backfill = Backfill::new("b1".into(), &ask, &fires, at(30));
        let next = backfill.next_claim(&job).expect("a tick");
        backfill.claim(next, "a", 1, "c1", None);
        assert!(backfill.finish(next.tick, "c1"));
        let hourly = Job::for_tests("report", "0 * * * *");
        assert_eq!(backfill.next_claim(&hourly), None, "the next hour is past the range");
        assert!(!backfill.clone().ran_out(&job), "the old schedule has ticks left");
        assert!(backfill.ran_out(&hourly));
        assert_eq!(backfill.progress(), (1, 1));
        assert!(backfill.is_over());
    }
}
