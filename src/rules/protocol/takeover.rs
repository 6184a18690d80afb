//! What a new leader claims for one job: the debts of earlier leaders it settles (each tick run
//! again or recorded lost, as the job's `delivery` says) and the ticks missed while the shard had
//! no leader (as its `catch_up` says).

use std::collections::BTreeSet;

use chrono::{DateTime, Utc};

use super::write::{Owner, Want};
use crate::rules::catch_up::{backlog_part, left_out, missed_ticks, Missed};
use crate::rules::config::{Delivery, Job};
use crate::rules::record::{Claim, Debt};

/// A leadership as the protocol sees it: its term, node and election's family (its pool, `None`
/// for the fleet's, and shard count).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Leader<'a> {
    pub(crate) term: i64,
    pub(crate) node: &'a str,
    pub(crate) pool: Option<&'a str>,
    pub(crate) shards: u32,
}

/// The debts `record` lists that `leader` settles: those of earlier leaders of its own election,
/// deposed since it leads, and those of an election family (a pool and shard count) no live
/// node runs any more (`gone`), whose elections have no successor. The debts of another live
/// family's leaders stay listed for their successors.
pub(crate) fn settleable(
    record: Option<&Claim>,
    leader: &Leader,
    gone: impl Fn(Option<&str>, u32) -> bool,
) -> Vec<Debt> {
    let Some(claim) = record else {
        return Vec::new();
    };
    claim
        .debts()
        .filter(|debt| {
            !debt.owed_by(leader.term, leader.node)
                && debt.shards.is_none_or(|shards| {
                    let pool = debt.pool.as_deref();
                    (pool == leader.pool && shards == leader.shards) || gone(pool, shards)
                })
        })
        .collect()
}

/// Which of the ticks an earlier leader left pending this leader runs, and which it records
/// lost. Ticks that leader `released` never started: each runs within the job's
/// `starting_deadline`. Any other may have started, even one not due yet by this leader's
/// clock (the other's may have run ahead): an `at-most-once` job runs none of them, an
/// `at-least-once` job every one within its `starting_deadline`.
pub(crate) fn redelivery(
    job: &Job,
    pending: &[DateTime<Utc>],
    now: DateTime<Utc>,
    released: bool,
) -> (Vec<DateTime<Utc>>, Vec<DateTime<Utc>>) {
    let floor = job
        .starting_deadline
        .and_then(|deadline| chrono::Duration::from_std(deadline).ok())
        .map(|deadline| now - deadline);
    pending.iter().partition(|tick| {
        floor.is_none_or(|floor| **tick >= floor) && (released || job.delivery == Delivery::AtLeastOnce)
    })
}

/// What a new leader knows when it settles one job.
pub(crate) struct Known<'a> {
    /// Where the job is in its leader's book.
    pub(crate) index: usize,
    pub(crate) job: &'a Job,
    pub(crate) record: Option<&'a Claim>,
    /// How many ticks of the job this leadership owes already.
    pub(crate) owed: usize,
    /// Whether this node started the tick itself, in an earlier leadership that could not write
    /// the start.
    pub(crate) started_here: &'a dyn Fn(DateTime<Utc>) -> bool,
    /// Whether no live node runs an election family (a pool and shard count) any more.
    pub(crate) gone: &'a dyn Fn(Option<&str>, u32) -> bool,
    /// Where the job stopped being missed: the takeover, or the end of a stall.
    pub(crate) took_over: DateTime<Utc>,
    pub(crate) now: DateTime<Utc>,
}

/// A debt an earlier leader left, as the plan settles it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Settled {
    pub(crate) debt: Debt,
    /// Ticks this node started itself: recorded now, not run again.
    pub(crate) started_here: Vec<DateTime<Utc>>,
    /// Ticks recorded lost.
    pub(crate) lost: Vec<DateTime<Utc>>,
}

/// What a new leader does for one job.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Plan {
    /// The write to claim, if anything is to be claimed or settled.
    pub(crate) want: Option<Want>,
    /// The debts it settles, each with what becomes of its ticks.
    pub(crate) settled: Vec<Settled>,
    /// Adopted ticks their leader released, which never started: they run as caught up, the
    /// other adopted ticks as redeliveries.
    pub(crate) never_started: BTreeSet<DateTime<Utc>>,
    /// The backlog is longer than the job may owe at once: the rest is claimed in parts.
    pub(crate) unfinished: bool,
    /// The schedule the record's tick was made by, when it is not the job's now: nothing is
    /// caught up.
    pub(crate) schedule_was: Option<String>,
    /// More ticks were missed than one takeover catches up: only the newest run.
    pub(crate) truncated: bool,
    /// For a job whose notifiers want `missed` events: how many missed ticks the takeover does
    /// not run, and the newest of them.
    pub(crate) left_out: Option<(usize, DateTime<Utc>)>,
}

/// Plans what `leader` claims for one job from what it knows.
pub(crate) fn plan(leader: &Leader, known: &Known) -> Plan {
    let job = known.job;
    let label = job.schedule.label();
    let last = known.record.map(|claim| claim.scheduled_at);
    let schedule_was = known
        .record
        .and_then(|claim| claim.schedule.as_deref())
        .filter(|was| *was != label)
        .map(str::to_string);
    let missed = match schedule_was {
        Some(_) => Missed::default(),
        None => missed_ticks(job, last, known.took_over),
    };
    let wants_missed = job
        .notify
        .iter()
        .any(|notifier| notifier.on.contains(&crate::rules::notify::Event::Missed));
    let left_out = match wants_missed && schedule_was.is_none() {
        true => left_out(job, last, known.took_over, missed.ticks.len()),
        false => None,
    };
    let (fresh, unfinished) = backlog_part(job, missed.ticks, last, known.took_over, known.now, known.owed);
    let mut plan = Plan {
        unfinished,
        schedule_was,
        truncated: missed.truncated,
        left_out,
        ..Plan::default()
    };
    let mut adopt = Vec::new();
    let mut settles = Vec::new();
    for debt in settleable(known.record, leader, known.gone) {
        let (started_here, unstarted): (Vec<DateTime<Utc>>, Vec<DateTime<Utc>>) =
            debt.pending.iter().partition(|tick| (known.started_here)(**tick));
        let (run, lost) = redelivery(job, &unstarted, known.now, debt.released);
        if debt.released {
            plan.never_started.extend(run.iter().copied());
        }
        adopt.extend(run);
        settles.push(Owner::of(&debt));
        plan.settled.push(Settled {
            debt,
            started_here,
            lost,
        });
    }
    adopt.sort_unstable();
    adopt.dedup();
    if !settles.is_empty() || !fresh.is_empty() {
        plan.want = Some(Want::catch_up(known.index, fresh, adopt, settles));
    }
    plan
}
#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn what_an_earlier_leader_left_is_run_or_recorded_lost() {
        let at = |second: i64| DateTime::<Utc>::from_timestamp(1_800_000_000 + second, 0).unwrap();
        let job = |delivery: Delivery, deadline: Option<u64>| Job {
            delivery,
            starting_deadline: deadline.map(Duration::from_secs),
            ..Job::for_tests("j", "* * * * * *")
        };
        let pending = [at(1), at(5), at(9), at(11)];
        let cases = [
            (
                job(Delivery::AtLeastOnce, None),
                false,
                vec![at(1), at(5), at(9), at(11)],
                vec![],
            ),
            (
                job(Delivery::AtLeastOnce, Some(5)),
                false,
                vec![at(5), at(9), at(11)],
                vec![at(1)],
            ),
            // 11 is not due by this clock, but may be by the earlier leader's.
            (
                job(Delivery::AtMostOnce, None),
                false,
                vec![],
                vec![at(1), at(5), at(9), at(11)],
            ),
            // Released: none of them started.
            (
                job(Delivery::AtMostOnce, None),
                true,
                vec![at(1), at(5), at(9), at(11)],
                vec![],
            ),
            (
                job(Delivery::AtMostOnce, Some(5)),
                true,
                vec![at(5), at(9), at(11)],
                vec![at(1)],
            ),
        ];
        for (job, released, run, lost) in cases {
            assert_eq!(
                redelivery(&job, &pending, at(10), released),
                (run, lost),
                "{:?} {:?} released: {released}",
                job.delivery,
                job.starting_deadline
            );
        }
    }
}
