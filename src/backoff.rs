//! Waiting before a retry: one capped, jittered backoff and one sleep that a cancellation cuts
//! short. Every retry loop of the node uses these two, so they all behave alike.

use std::time::Duration;

use rand::Rng;
use tokio_util::sync::CancellationToken;

/// Capped exponential backoff with equal jitter: the n-th delay is drawn uniformly from the
/// upper half of `min(base × 2ⁿ, cap)`. Half the delay is always waited, so retries never come
/// in a burst; the other half is random, so a fleet that lost etcd does not return in lockstep.
#[derive(Debug, Clone)]
pub struct Backoff {
    base: Duration,
    cap: Duration,
    attempt: u32,
}

impl Backoff {
    /// What the node waits between attempts to reach etcd: 200 ms growing to 5 s.
    pub fn coordination() -> Backoff {
        Backoff::new(Duration::from_millis(200), Duration::from_secs(5))
    }

    /// Starts at `base`, doubling per delay up to `cap` (at least `base`).
    pub fn new(base: Duration, cap: Duration) -> Backoff {
        Backoff {
            base,
            cap: cap.max(base),
            attempt: 0,
        }
    }

    /// The delay before the next attempt.
    pub fn next_delay(&mut self) -> Duration {
        let ceiling = self.base.saturating_mul(1u32 << self.attempt.min(20)).min(self.cap);
        self.attempt = self.attempt.saturating_add(1);
        let millis = ceiling.as_millis() as u64;
        Duration::from_millis(rand::thread_rng().gen_range(millis / 2..=millis))
    }

    /// After a success: the next delay starts from `base` again.
    pub fn reset(&mut self) {
        self.attempt = 0;
    }
}

/// Sleeps for `duration` unless `cancel` fires first. Returns whether the whole sleep passed.
pub async fn sleep_or_cancel(duration: Duration, cancel: &CancellationToken) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(duration) => true,
        _ = cancel.cancelled() => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_in_their_upper_half_up_to_the_cap() {
        let mut backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(300));
        for ceiling in [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300, 300] {
            let ceiling = Duration::from_secs(ceiling);
            let delay = backoff.next_delay();
            assert!(delay >= ceiling / 2 && delay <= ceiling, "{delay:?} for {ceiling:?}");
        }
        for _ in 0..100 {
            assert!(backoff.next_delay() <= Duration::from_secs(300));
        }
        backoff.reset();
        assert!(backoff.next_delay() <= Duration::from_secs(1));
    }

    #[test]
    fn the_cap_is_never_below_the_base() {
        let mut backoff = Backoff::new(Duration::from_secs(2), Duration::from_secs(1));
        let delay = backoff.next_delay();
        assert!(delay >= Duration::from_secs(1) && delay <= Duration::from_secs(2));
    }

    #[tokio::test]
    async fn a_cancelled_sleep_ends_early_and_says_so() {
        let cancel = CancellationToken::new();
        assert!(sleep_or_cancel(Duration::from_millis(1), &cancel).await);
        cancel.cancel();
        assert!(!sleep_or_cancel(Duration::from_secs(3600), &cancel).await);
    }
}
