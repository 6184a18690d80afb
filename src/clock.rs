//! The one place that reads the wall clock and sleeps by it.
//!
//! Ticks are wall-clock instants; tokio sleeps by the monotonic clock. Sleeping to a wall-clock
//! instant therefore re-reads the wall clock after every wake and sleeps again if it is still
//! early, so a tick never fires before its time even if the clock was stepped meanwhile.

use chrono::{DateTime, Utc};

pub fn now() -> DateTime<Utc> {
    Utc::now()
}

/// Returns at or after `target` by the wall clock.
pub async fn sleep_until(target: DateTime<Utc>) {
    loop {
        let remaining = target - now();
        match remaining.to_std() {
            Ok(wait) if !wait.is_zero() => tokio::time::sleep(wait).await,
            _ => return,
        }
    }
}
