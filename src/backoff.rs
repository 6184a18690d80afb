//! Waiting before a retry: one capped, jittered backoff and one sleep that a cancellation cuts
//! short. Every retry loop of the node uses these two, so they all behave alike.

use std::time::Duration;

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
        Duration::from_millis(rand::random_range(millis / 2..=millis))
    }

    /// After a success: the next delay starts from `base` again.
    pub fn reset(&mut self) {
        self.attempt = 0;
    }
}

/// One pause for the whole node, started when etcd pushes back ("too many requests", or no
/// answer in time): every campaign waits it out before its request, so thousands of shards
/// slow down together instead of each retrying on its own schedule. It grows while etcd keeps
/// pushing back and starts small again after a request goes through.
#[derive(Debug)]
pub struct Pushback {
    state: std::sync::Mutex<(Backoff, Option<tokio::time::Instant>)>,
}

impl Pushback {
    pub fn new() -> Pushback {
        Pushback {
            state: std::sync::Mutex::new((Backoff::coordination(), None)),
        }
    }

    /// etcd pushed back: the pause is extended by the next delay. Returns that delay.
    pub fn hit(&self) -> Duration {
        let mut state = self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let delay = state.0.next_delay();
        let until = tokio::time::Instant::now() + delay;
        state.1 = Some(state.1.map_or(until, |was| was.max(until)));
        delay
    }

    /// A request went through: the next pushback pauses briefly again.
    pub fn eased(&self) {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .0
            .reset();
    }

    /// Waits until the pause is over.
    pub async fn wait(&self) {
        let until = self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).1;
        if let Some(until) = until {
            tokio::time::sleep_until(until).await;
        }
    }
}

impl Default for Pushback {
    fn default() -> Self {
        Pushback::new()
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

    #[tokio::test(start_paused = true)]
    async fn a_pushback_pauses_every_waiter_and_grows_until_eased() {
        let pushback = Pushback::new();
        let started = tokio::time::Instant::now();
        pushback.wait().await;
        assert_eq!(started.elapsed(), Duration::ZERO, "no pause before any pushback");
        let first = pushback.hit();
        let second = pushback.hit();
        assert!(second >= Duration::from_millis(200), "{second:?}");
        // Two waiters, one pause: both end when the longer delay does.
        tokio::join!(pushback.wait(), pushback.wait());
        assert_eq!(started.elapsed(), first.max(second));
        pushback.eased();
        assert!(pushback.hit() <= Duration::from_millis(200));
    }

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
