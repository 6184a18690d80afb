//! Concurrency groups: at most `limit` attempts of a group's jobs run at once across the fleet.
//!
//! A group has `limit` numbered slots. An attempt runs while it holds one: a key per slot, on
//! the holding node's lease, created only if absent, so two attempts never hold one slot and a
//! dead node's slots go with its lease. An attempt that finds no slot free waits in the group's
//! line, a key per waiting attempt named by its [`Place`]: when it became due, then its job's
//! name. The line is served in that order: a waiting attempt takes a free slot only if fewer
//! attempts wait ahead of it than slots are free ([`admit`]), and an attempt that ends hands its
//! slot to the first in line ([`heir`]) in the same write that frees it. So a grouped run costs
//! two writes whether it waited or not: its slot taken (or its place in line) and its slot
//! handed on (or freed).
//!
//! A limit lowered by a reload holds at once for every new run: a slot numbered at or past the
//! limit is neither taken, nor handed on, nor run in ([`within`]), and the slots still held past
//! it count against the free ones below it until the runs holding them end.
//!
//! Pure: what etcd holds is passed in.

use std::collections::BTreeSet;
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Serialize};

/// The most runs a group may allow at once: each is a key in etcd while it runs.
pub const MAX_LIMIT: u32 = 10_000;
/// At most this many groups: each has a gauge per node and a line in `status`.
pub const MAX_GROUPS: usize = 1_000;
/// Group names become etcd key segments and metric labels.
pub const MAX_GROUP_NAME: usize = 64;

/// A validated `[groups.<name>]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    pub name: String,
    /// At most this many attempts of the group's jobs run at once, fleet-wide.
    pub limit: u32,
    /// How long a tick waits for a slot; `None`: until the job's next tick.
    pub wait: Option<Duration>,
}

/// A waiting attempt's place in its group's line: the line is served in this order.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Place {
    /// When the tick became due (a run asked for by hand: when it was asked for).
    pub due: DateTime<Utc>,
    /// The job's name; for one node's instance of a fanned-out job, the instance's.
    pub job: String,
    /// Tells apart two attempts of one job due at one instant (a tick and a run asked for by
    /// hand at that same instant).
    pub fence: i64,
}

impl Place {
    /// The key segment naming this place, which sorts as places do: the instant at a fixed
    /// width, then the job, then the fence at a fixed width after a `!`, which sorts before
    /// every character a job's name may hold (so `a` comes before `a-b`, as names do).
    pub fn segment(&self) -> String {
        format!(
            "{}/{}!{:020}",
            self.due.to_rfc3339_opts(SecondsFormat::Nanos, true),
            self.job,
            self.fence.max(0)
        )
    }

    /// The place a key segment names; `None` for anything [`Place::segment`] does not make.
    pub fn parse(segment: &str) -> Option<Place> {
        let (due, rest) = segment.split_once('/')?;
        let due = DateTime::parse_from_rfc3339(due).ok()?.with_timezone(&Utc);
        let (job, fence) = rest.rsplit_once('!')?;
        let job = job.to_string();
        let fence = fence.parse().ok()?;
        (!job.is_empty()).then_some(Place { due, job, fence })
    }
}

/// Who holds a slot, or waits for one: the value of both keys. A slot handed to a waiting
/// attempt holds that attempt's value, on that attempt's lease.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Holder {
    pub node: String,
    pub job: String,
    /// The tick the attempt runs (a run asked for by hand: when it was asked for).
    pub tick: DateTime<Utc>,
    pub fence: i64,
    /// When it started waiting.
    pub since: DateTime<Utc>,
}

/// A group as etcd shows it: the slots held and the places in line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Line {
    pub held: BTreeSet<u32>,
    pub waiting: BTreeSet<Place>,
}

/// What an attempt at a place in line does now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Take this free slot.
    Take(u32),
    /// Wait: as many attempts wait ahead of it as slots are free, or more.
    Wait,
}

/// Whether the attempt at `place` may take a slot of a group of `limit` now. The `n`-th in line
/// (counting from 0, itself not counted if it waits already) takes the `n`-th free slot, so the
/// first few in line never reach for the same one.
pub fn admit(line: &Line, place: &Place, limit: u32) -> Admission {
    admit_counted(
        line.waiting.range(..place).count(),
        |slot| line.held.contains(&slot),
        line.held.range(limit..).count(),
        limit,
        0,
    )
}

/// [`admit`] for an attempt with `ahead` attempts waiting ahead of it, in a group whose slots
/// `held` says are held: what a node computes from its mirror without copying the line. Only
/// the first `limit` ahead matter, so a caller may stop counting there.
///
/// `beyond` slots are held at or past the limit (it was lowered while they ran): each counts
/// against a free slot below it, so the group runs no more than `limit` at once from the moment
/// the runs holding them end, and no new run starts beside them meanwhile.
///
/// `spread` picks among the free slots past those left to the attempts ahead: 0 for an attempt
/// in line (the order of the line keeps its first few from reaching for one slot); for one that
/// is not, a number of its own (a hash of its job), so that the many attempts that find the
/// group free at one instant reach for different slots instead of all for the first.
pub fn admit_counted(ahead: usize, held: impl Fn(u32) -> bool, beyond: usize, limit: u32, spread: usize) -> Admission {
    let mut free: Vec<u32> = (0..limit).filter(|slot| !held(*slot)).collect();
    free.truncate(free.len().saturating_sub(beyond));
    match free.len().checked_sub(ahead) {
        Some(room) if room > 0 => Admission::Take(free[ahead + spread % room]),
        _ => Admission::Wait,
    }
}

/// Whether `slot` is one of a group of `limit`'s: one past it (the limit was lowered by a
/// reload while it was held) is freed by its holder instead of handed on, and an attempt handed
/// one gives it back and waits.
pub fn within(slot: u32, limit: u32) -> bool {
    slot < limit
}

/// The attempt an ending one hands its slot to: the first in line.
pub fn heir(line: &Line) -> Option<&Place> {
    line.waiting.first()
}

#[cfg(test)]
mod model;
#[cfg(test)]
mod tests {
    use super::*;

    fn place(second: i64, job: &str) -> Place {
        Place {
            due: DateTime::from_timestamp(1_800_000_000 + second, 0).expect("instant"),
            job: job.into(),
            fence: 7,
        }
    }

    fn line(held: &[u32], waiting: &[Place]) -> Line {
        Line {
            held: held.iter().copied().collect(),
            waiting: waiting.iter().cloned().collect(),
        }
    }

    #[test]
    fn the_line_is_served_by_due_time_then_job_name() {
        let (a0, b0, a1) = (place(0, "a"), place(0, "b"), place(1, "a"));
        let cases = [
            (line(&[], &[]), a0.clone(), 2, Admission::Take(0), "an empty group"),
            (line(&[0], &[]), a0.clone(), 2, Admission::Take(1), "the free slot"),
            (line(&[0, 1], &[]), a0.clone(), 2, Admission::Wait, "a full group"),
            (
                line(&[0], std::slice::from_ref(&a0)),
                b0.clone(),
                2,
                Admission::Wait,
                "one free slot, one waiting ahead",
            ),
            (
                line(&[0], &[a0.clone(), b0.clone()]),
                a0.clone(),
                2,
                Admission::Take(1),
                "first in line, itself counted out",
            ),
            (
                line(&[1], &[a0.clone(), b0.clone(), a1.clone()]),
                b0.clone(),
                3,
                Admission::Take(2),
                "second in line takes the second free slot",
            ),
            (
                line(&[], std::slice::from_ref(&a1)),
                a0.clone(),
                1,
                Admission::Take(0),
                "an earlier due tick goes before a later one already waiting",
            ),
            (line(&[], &[]), a0.clone(), 0, Admission::Wait, "no slot at all"),
        ];
        for (line, place, limit, expected, why) in cases {
            assert_eq!(admit(&line, &place, limit), expected, "{why}");
        }
        assert_eq!(heir(&line(&[0], &[b0.clone(), a1])), Some(&b0));
        // Not in line: a slot of its own among those the attempts ahead leave.
        let held = |slot: u32| slot == 1;
        assert_eq!(admit_counted(0, held, 0, 4, 0), Admission::Take(0));
        assert_eq!(admit_counted(0, held, 0, 4, 5), Admission::Take(3));
        assert_eq!(admit_counted(1, held, 0, 4, 7), Admission::Take(3));
        assert_eq!(admit_counted(1, held, 0, 4, 6), Admission::Take(2));
        assert_eq!(admit_counted(3, held, 0, 4, 6), Admission::Wait);
        assert_eq!(heir(&line(&[0], &[])), None);
    }

    #[test]
    fn a_lowered_limit_holds_for_new_runs_while_slots_past_it_are_held() {
        let a0 = place(0, "a");
        let cases = [
            (
                line(&[1, 2], &[]),
                1,
                Admission::Wait,
                "slot 0 free, two held past a limit of 1",
            ),
            (
                line(&[2], &[]),
                2,
                Admission::Take(0),
                "one held past a limit of 2: one slot left below",
            ),
            (line(&[0, 2], &[]), 2, Admission::Wait, "one held below, one past"),
            (line(&[1, 2], &[]), 3, Admission::Take(0), "no limit lowered"),
            (
                line(&[0, 3], &[]),
                3,
                Admission::Take(1),
                "two free below, one held past",
            ),
            (
                line(&[0, 1, 3], &[]),
                3,
                Admission::Wait,
                "one free below, one held past",
            ),
            (line(&[5], &[]), 3, Admission::Take(0), "one held past, two free below"),
        ];
        for (line, limit, expected, why) in cases {
            assert_eq!(admit(&line, &a0, limit), expected, "{why}");
        }
        assert!(within(0, 1) && !within(1, 1) && !within(0, 0));
    }

    #[test]
    fn a_place_is_named_by_a_key_segment_that_sorts_as_places_do() {
        let places = [
            place(0, "a"),
            place(0, "a-b"),
            place(0, "b"),
            place(1, "a"),
            Place {
                due: DateTime::from_timestamp(1_800_000_000, 5).expect("instant"),
                job: "a".into(),
                fence: 3,
            },
        ];
        for place in &places {
            assert_eq!(Place::parse(&place.segment()).as_ref(), Some(place));
        }
        let mut by_segment: Vec<&Place> = places.iter().collect();
        by_segment.sort_by_key(|place| place.segment());
        let mut by_place: Vec<&Place> = places.iter().collect();
        by_place.sort();
        assert_eq!(by_segment, by_place);
        for bad in [
            "",
            "x/a!1",
            "2027-01-15T08:00:00Z/!1",
            "2027-01-15T08:00:00Z/a!x",
            "2027-01-15T08:00:00Z/a",
        ] {
            assert_eq!(Place::parse(bad), None, "{bad:?}");
        }
    }
}
