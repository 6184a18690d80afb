//! How far ahead of a tick a leader claims it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How far ahead of a tick to claim it: a few times the recent claim latency, within bounds.
///
/// Claiming ahead keeps the etcd round trip out of the spawn's lateness. The lead is also the
/// window in which a leader that dies after claiming a tick loses it, so it is kept as short as
/// the measured latency allows instead of a fixed generous margin.
#[derive(Clone)]
pub(crate) struct ClaimLead {
    average_micros: Arc<AtomicU64>,
}

impl ClaimLead {
    const MIN: Duration = Duration::from_millis(3);
    const MAX: Duration = Duration::from_millis(50);
    const INITIAL: Duration = Duration::from_millis(10);

    pub(crate) fn new() -> Self {
        ClaimLead {
            average_micros: Arc::new(AtomicU64::new(Self::INITIAL.as_micros() as u64 / 3)),
        }
    }

    pub(crate) fn lead(&self) -> Duration {
        let average = Duration::from_micros(self.average_micros.load(Ordering::Relaxed));
        (average * 3).clamp(Self::MIN, Self::MAX)
    }

    /// Folds one claim's round trip into the moving average (weight 1/8).
    pub(crate) fn observe(&self, took: Duration) {
        let took = took.as_micros().min(u128::from(u32::MAX)) as u64;
        let average = self.average_micros.load(Ordering::Relaxed);
        self.average_micros
            .store(average - average / 8 + took / 8, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claim_lead_follows_latency_within_bounds() {
        let lead = ClaimLead::new();
        assert_eq!(lead.lead(), Duration::from_millis(10) - Duration::from_micros(1));
        for _ in 0..100 {
            lead.observe(Duration::from_micros(500));
        }
        assert_eq!(lead.lead(), ClaimLead::MIN);
        for _ in 0..100 {
            lead.observe(Duration::from_millis(8));
        }
        assert!(
            lead.lead() > Duration::from_millis(20) && lead.lead() <= Duration::from_millis(24),
            "{:?}",
            lead.lead()
        );
        for _ in 0..100 {
            lead.observe(Duration::from_secs(1));
        }
        assert_eq!(lead.lead(), ClaimLead::MAX);
    }
}
