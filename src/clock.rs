//! The one place that reads the wall clock and sleeps by it.
//!
//! Ticks are wall-clock instants; tokio sleeps by the monotonic clock. Sleeping to a wall-clock
//! instant therefore re-reads the wall clock after every wake and sleeps again if it is still
//! early, so a tick never fires before its time even if the clock was stepped meanwhile.

use std::time::Duration;

use chrono::{DateTime, Utc};

/// tokio's timer wheel has millisecond slots and rounds up; the last stretch before a tick is
/// slept in finer steps so a run starts within a fraction of a millisecond of it.
const FINE_STRETCH: Duration = Duration::from_millis(2);
const FINE_STEP: Duration = Duration::from_micros(100);

pub fn now() -> DateTime<Utc> {
    Utc::now()
}

/// A reading of the wall clock beside the monotonic one, which tells a step of the wall clock
/// (NTP, an operator) from time that really passed (a stall, a slow claim), which both see.
#[derive(Debug, Clone, Copy)]
pub struct Reading {
    wall: DateTime<Utc>,
    monotonic: std::time::Instant,
}

impl Reading {
    pub fn take() -> Reading {
        Reading {
            wall: now(),
            monotonic: std::time::Instant::now(),
        }
    }

    pub fn wall(&self) -> DateTime<Utc> {
        self.wall
    }

    /// How much further the wall clock went forward than the monotonic one since this reading.
    pub fn wall_step(&self) -> chrono::Duration {
        let passed = chrono::Duration::from_std(self.monotonic.elapsed()).unwrap_or(chrono::Duration::MAX);
        (now() - self.wall).checked_sub(&passed).unwrap_or_default()
    }
}

fn until(target: DateTime<Utc>) -> Duration {
    (target - now()).to_std().unwrap_or_default()
}

/// Returns at or after `target` by the wall clock, within a millisecond or so: for deadlines
/// that are no tick, without the fine last stretch of [`sleep_until`].
pub async fn sleep_past(target: DateTime<Utc>) {
    loop {
        let remaining = until(target);
        if remaining.is_zero() {
            return;
        }
        tokio::time::sleep(remaining).await;
    }
}

/// Returns at or after `target` by the wall clock.
pub async fn sleep_until(target: DateTime<Utc>) {
    loop {
        let remaining = until(target);
        if remaining <= FINE_STRETCH {
            break;
        }
        tokio::time::sleep(remaining - FINE_STRETCH).await;
    }
    if until(target).is_zero() {
        return;
    }
    // At most FINE_STRETCH of short blocking sleeps; block_in_place lets the runtime move other
    // tasks off this worker meanwhile.
    tokio::task::block_in_place(|| loop {
        let remaining = until(target);
        if remaining.is_zero() {
            return;
        }
        std::thread::sleep(remaining.min(FINE_STEP));
    });
}

/// An optional instant as logs and messages show it: RFC 3339 to the second, or `-`.
pub fn shown(at: Option<DateTime<Utc>>) -> String {
    at.map_or_else(|| "-".to_owned(), rfc3339)
}

/// An instant as logs and messages show it: RFC 3339 to the second, in UTC.
pub fn rfc3339(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}
