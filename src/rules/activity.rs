//! Runs per minute over the last hour, by how they ended: what each node counts of its own runs
//! and publishes, and the fleet's sum of them that the dashboard draws.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::rules::record::{Outcome, RunRecord};

/// How many minutes are kept: the last hour.
pub const MINUTES: usize = 60;

/// How a run ended, as the strip colours it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Success,
    Failure,
    /// Not run on purpose: skipped, paused, replaced, group full.
    Held,
    Lost,
}

impl Kind {
    pub fn of(record: &RunRecord) -> Kind {
        match (record.outcome, record.exit_code) {
            (Outcome::Exited, Some(0)) => Kind::Success,
            (Outcome::Skipped | Outcome::Paused | Outcome::Replaced | Outcome::GroupFull, _) => Kind::Held,
            (Outcome::Lost, _) => Kind::Lost,
            _ => Kind::Failure,
        }
    }
}

/// One minute's runs by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    pub success: u32,
    pub failure: u32,
    pub held: u32,
    pub lost: u32,
}

impl Counts {
    fn add(&mut self, kind: Kind) {
        let count = match kind {
            Kind::Success => &mut self.success,
            Kind::Failure => &mut self.failure,
            Kind::Held => &mut self.held,
            Kind::Lost => &mut self.lost,
        };
        *count = count.saturating_add(1);
    }

    fn merge(&mut self, other: &Counts) {
        self.success = self.success.saturating_add(other.success);
        self.failure = self.failure.saturating_add(other.failure);
        self.held = self.held.saturating_add(other.held);
        self.lost = self.lost.saturating_add(other.lost);
    }
}

/// A node's runs per minute, newest last, each minute by its start (seconds since the epoch).
/// The value of `/activity/<node>`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Activity {
    pub minutes: Vec<(i64, Counts)>,
}

fn minute_of(at: DateTime<Utc>) -> i64 {
    at.timestamp().div_euclid(60) * 60
}

impl Activity {
    /// Counts a run that ended at `at`.
    pub fn record(&mut self, at: DateTime<Utc>, kind: Kind) {
        let minute = minute_of(at);
        match self.minutes.iter_mut().rev().find(|(start, _)| *start == minute) {
            Some((_, counts)) => counts.add(kind),
            None => {
                let mut counts = Counts::default();
                counts.add(kind);
                self.minutes.push((minute, counts));
                self.minutes.sort_by_key(|(start, _)| *start);
            }
        }
        self.forget_before(at);
    }

    /// Drops the minutes older than the last hour before `now`.
    pub fn forget_before(&mut self, now: DateTime<Utc>) {
        let oldest = minute_of(now) - (MINUTES as i64 - 1) * 60;
        self.minutes.retain(|(start, _)| *start >= oldest);
        let over = self.minutes.len().saturating_sub(MINUTES);
        self.minutes.drain(..over);
    }
}

/// The fleet's last hour before `now`, minute by minute, oldest first: every node's counts
/// summed. Minutes a node did not count (or published outside the hour) add nothing.
pub fn fleet_hour<'a>(nodes: impl IntoIterator<Item = &'a Activity>, now: DateTime<Utc>) -> Vec<(i64, Counts)> {
    let newest = minute_of(now);
    let mut hour: Vec<(i64, Counts)> = (0..MINUTES as i64)
        .rev()
        .map(|ago| (newest - ago * 60, Counts::default()))
        .collect();
    for node in nodes {
        for (start, counts) in &node.minutes {
            if let Some(index) = usize::try_from((start - hour[0].0) / 60)
                .ok()
                .filter(|index| *index < MINUTES)
            {
                if hour[index].0 == *start {
                    hour[index].1.merge(counts);
                }
            }
        }
    }
    hour
}

#[cfg(test)]
mod tests {
    use chrono::{DateTime, Utc};

    use super::{fleet_hour, Activity, Counts, Kind, MINUTES};

    fn at(second: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + second, 0).unwrap_or_default()
    }

    #[test]
    fn a_node_counts_its_runs_per_minute_for_an_hour() {
        let mut activity = Activity::default();
        activity.record(at(0), Kind::Success);
        activity.record(at(10), Kind::Failure);
        activity.record(at(70), Kind::Held);
        assert_eq!(activity.minutes.len(), 2);
        activity.record(at(3_650), Kind::Lost);
        assert_eq!(activity.minutes.len(), 2, "the minutes past the hour are forgotten");
        assert_eq!(
            activity.minutes[1].1,
            Counts {
                lost: 1,
                ..Counts::default()
            }
        );
    }

    #[test]
    fn the_fleet_hour_sums_the_nodes_minute_by_minute() {
        let (mut a, mut b) = (Activity::default(), Activity::default());
        a.record(at(0), Kind::Success);
        b.record(at(5), Kind::Success);
        b.record(at(65), Kind::Failure);
        let stale = Activity {
            minutes: vec![(
                at(-7_200).timestamp() / 60 * 60,
                Counts {
                    success: 9,
                    ..Counts::default()
                },
            )],
        };
        let hour = fleet_hour([&a, &b, &stale], at(90));
        assert_eq!(hour.len(), MINUTES);
        let total: u32 = hour.iter().map(|(_, counts)| counts.success + counts.failure).sum();
        assert_eq!(total, 3, "the stale node's hour is not this one");
        assert_eq!(hour[MINUTES - 1].1.failure, 1);
        assert_eq!(hour[MINUTES - 2].1.success, 2);
    }
}
