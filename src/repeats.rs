//! Repeated warnings folded into one line per cause per interval.
//!
//! A fleet of thousands of shards hits one etcd hiccup in every shard at once; a line per shard
//! per retry would bury everything else in the log. The first occurrence of a cause is logged,
//! then at most one line per [`INTERVAL`], which says how many were left out since.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// At most one line per cause in this long.
pub const INTERVAL: Duration = Duration::from_secs(10);

#[derive(Default)]
struct Cause {
    logged_at: Option<Instant>,
    left_out: u64,
}

static CAUSES: Mutex<Option<HashMap<&'static str, Cause>>> = Mutex::new(None);

/// Whether this occurrence of `cause` is logged, and if so how many occurrences were left out
/// since its last line.
pub fn log_now(cause: &'static str) -> Option<u64> {
    log_at(cause, Instant::now())
}

fn log_at(cause: &'static str, now: Instant) -> Option<u64> {
    let mut causes = CAUSES.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let entry = causes.get_or_insert_with(HashMap::new).entry(cause).or_default();
    match entry.logged_at {
        Some(at) if now.saturating_duration_since(at) < INTERVAL => {
            entry.left_out += 1;
            None
        }
        _ => {
            entry.logged_at = Some(now);
            Some(std::mem::take(&mut entry.left_out))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cause_is_logged_once_per_interval_with_the_count_left_out() {
        let start = Instant::now();
        let cause = "test cause";
        assert_eq!(log_at(cause, start), Some(0));
        for _ in 0..5 {
            assert_eq!(log_at(cause, start + Duration::from_secs(1)), None);
        }
        assert_eq!(log_at("another cause", start), Some(0), "causes fold apart");
        assert_eq!(log_at(cause, start + INTERVAL), Some(5));
        assert_eq!(log_at(cause, start + INTERVAL + Duration::from_secs(1)), None);
    }
}
