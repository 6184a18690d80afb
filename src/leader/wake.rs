//! When a term's firing loop wakes next: a pure function of what the loop knows, kept apart
//! from the loop's effects so each case can be tested alone.

use std::time::Duration;

use chrono::{DateTime, Utc};

/// How long before an at-least-once instant it may be claimed: the claim then carries the
/// previous instant's starts.
pub(super) const CLAIM_AHEAD: Duration = Duration::from_millis(1500);

/// At most how long after firing an instant its runs are given to start before the next
/// instant's early claim carries their starts; it goes as soon as they all have. Starts later
/// than that ride the claim after.
pub(super) const STARTS_SETTLE: Duration = Duration::from_millis(50);

/// What the loop knows when it decides how long to sleep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Known {
    /// An instant already claimed ahead, waiting to fire.
    pub(super) claimed: Option<DateTime<Utc>>,
    /// The next instant of the queue, and whether every job due then is at-least-once (it may
    /// be claimed ahead).
    pub(super) next: Option<(DateTime<Utc>, bool)>,
    /// When the last instant fired, and its tick.
    pub(super) last_fired: Option<(DateTime<Utc>, DateTime<Utc>)>,
    /// How long before an instant it is claimed (or confirmed, if claimed ahead).
    pub(super) claim_lead: chrono::Duration,
}

/// When to wake, and whether to wake earlier once the runs of a fired instant have all begun.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Wake {
    /// `None`: nothing is queued; only an event wakes the loop.
    pub(super) at: Option<DateTime<Utc>>,
    /// The tick of the instant whose starts an early claim waits for: the loop wakes as soon as
    /// its runs have all begun, at `at` at the latest.
    pub(super) settling: Option<DateTime<Utc>>,
}

/// An instant claimed ahead wakes the loop `claim_lead` before it is due, to confirm the
/// leadership and fire. Otherwise the next instant is claimed: ahead if it may be, once the
/// last instant's runs have had a moment to start, so the claim carries their starts; else
/// `claim_lead` before it is due.
pub(super) fn next_wake(known: Known) -> Wake {
    let lead = known.claim_lead;
    let at = match (known.claimed, known.next) {
        (Some(due), _) => Some(earlier(due, lead)),
        (None, Some((due, ahead))) => Some(claim_time(due, ahead, known.last_fired.map(|(at, _)| at), lead)),
        (None, None) => None,
    };
    let settle = chrono::Duration::from_std(STARTS_SETTLE).unwrap_or_default();
    let settling = match (known.claimed, known.last_fired, at) {
        (None, Some((fired_at, fired)), Some(at)) if at <= later(fired_at, settle) => Some(fired),
        _ => None,
    };
    Wake { at, settling }
}

/// When to claim the instant `due`: ahead, once the last instant's runs have had a moment to
/// start, if it may be claimed ahead (`ahead`); otherwise shortly before it is due.
fn claim_time(
    due: DateTime<Utc>,
    ahead: bool,
    last_fired: Option<DateTime<Utc>>,
    lead: chrono::Duration,
) -> DateTime<Utc> {
    let just_before = earlier(due, lead);
    if !ahead {
        return just_before;
    }
    let ahead = earlier(due, chrono::Duration::from_std(CLAIM_AHEAD).unwrap_or_default());
    let settled = last_fired.map(|at| later(at, chrono::Duration::from_std(STARTS_SETTLE).unwrap_or_default()));
    settled.map_or(ahead, |settled| settled.max(ahead)).min(just_before)
}

/// `at - by`, or the earliest instant chrono holds: instants come from etcd records, and at
/// chrono's limits `-` panics.
fn earlier(at: DateTime<Utc>, by: chrono::Duration) -> DateTime<Utc> {
    at.checked_sub_signed(by).unwrap_or(DateTime::<Utc>::MIN_UTC)
}

/// `at + by`, or the latest instant chrono holds.
fn later(at: DateTime<Utc>, by: chrono::Duration) -> DateTime<Utc> {
    at.checked_add_signed(by).unwrap_or(DateTime::<Utc>::MAX_UTC)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: i64) -> DateTime<Utc> {
        DateTime::<Utc>::from_timestamp_millis(1_800_000_000_000 + ms).unwrap()
    }

    /// Instants from etcd at chrono's limits: no panic, a wake at the limit.
    #[test]
    fn instants_at_the_limits_of_time_do_not_panic() {
        let lead = chrono::Duration::milliseconds(100);
        let (min, max) = (DateTime::<Utc>::MIN_UTC, DateTime::<Utc>::MAX_UTC);
        let cases = [
            (Some(min), None, None),
            (None, Some((min, true)), Some((max, max))),
            (None, Some((min, false)), None),
            (None, Some((max, true)), Some((max, max))),
        ];
        for (claimed, next, last_fired) in cases {
            let wake = next_wake(Known {
                claimed,
                next,
                last_fired,
                claim_lead: lead,
            });
            assert!(wake.at.is_some(), "{claimed:?} {next:?} {last_fired:?}");
        }
    }

    #[test]
    fn each_case_wakes_when_the_claim_or_the_tick_needs_it() {
        let lead = chrono::Duration::milliseconds(100);
        let known = |claimed, next, last_fired| Known {
            claimed,
            next,
            last_fired,
            claim_lead: lead,
        };
        let cases = [
            (
                "nothing queued: only an event wakes it",
                known(None, None, None),
                None,
                None,
            ),
            (
                "claimed ahead: confirmed the lead before it is due",
                known(Some(at(10_000)), Some((at(11_000), true)), Some((at(9_000), at(9_000)))),
                Some(at(9_900)),
                None,
            ),
            (
                "an at-most-once instant is claimed the lead before it is due",
                known(None, Some((at(10_000), false)), None),
                Some(at(9_900)),
                None,
            ),
            (
                "an at-least-once instant, nothing fired yet: claimed CLAIM_AHEAD before",
                known(None, Some((at(10_000), true)), None),
                Some(at(8_500)),
                None,
            ),
            (
                "just after an instant fired: it waits for that instant's runs to begin",
                known(None, Some((at(10_000), true)), Some((at(9_010), at(9_000)))),
                Some(at(9_060)),
                Some(at(9_000)),
            ),
            (
                "long after the last instant fired: claimed CLAIM_AHEAD before, no waiting",
                known(None, Some((at(10_000), true)), Some((at(5_000), at(5_000)))),
                Some(at(8_500)),
                None,
            ),
            (
                "an instant fired within the lead: never later than the lead before it",
                known(None, Some((at(10_000), true)), Some((at(9_880), at(9_000)))),
                Some(at(9_900)),
                Some(at(9_000)),
            ),
        ];
        for (case, known, at, settling) in cases {
            assert_eq!(next_wake(known), Wake { at, settling }, "{case}");
        }
    }
}
