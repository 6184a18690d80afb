//! Failed token attempts: counted in `shardcron_http_unauthorized_total`, logged at most once
//! a minute per peer address, and slowed per peer after a few.
//!
//! A token needs only 16 bytes and an operator may choose a passphrase: without this, a
//! client could guess as fast as the node answers, unseen. The delay holds only the 401
//! answers of the peer that keeps failing; probes need no token and other peers are not
//! slowed.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, Once};
use std::time::{Duration, Instant};

use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::MetricType;

/// Failures a peer has before its answers are slowed: a mistyped token costs nothing.
const FREE_FAILURES: u32 = 5;
/// The delay of the first slowed answer; it doubles with each failure after it.
const FIRST_DELAY: Duration = Duration::from_millis(100);
/// The longest delay: long enough to make guessing slow, short enough that an operator who
/// fixes the token is answered at once.
pub(super) const MAX_DELAY: Duration = Duration::from_secs(2);
/// A peer without a failure for this long starts over.
const FORGET_AFTER: Duration = Duration::from_secs(600);
/// How often a peer's failures are logged at most.
const WARN_EVERY: Duration = Duration::from_secs(60);
/// The most peers remembered: past it, those that failed longest ago are forgotten first.
const MAX_PEERS: usize = 4096;

/// Every 401 this process answered, for the metric.
static UNAUTHORIZED: AtomicU64 = AtomicU64::new(0);
static EXPORTED: Once = Once::new();

#[derive(Default)]
pub(super) struct FailedTokens {
    peers: Mutex<HashMap<Option<IpAddr>, Peer>>,
}

struct Peer {
    /// Failures since the peer last went [`FORGET_AFTER`] without one.
    failures: u32,
    last: Instant,
    /// When its failures were last logged.
    warned: Option<Instant>,
}

impl FailedTokens {
    pub(super) fn new() -> FailedTokens {
        EXPORTED.call_once(|| crate::metrics::get().register_collector(Box::new(Collector)));
        FailedTokens::default()
    }

    /// Records a 401 answered to `peer` (`None`: its address is unknown) and returns how long
    /// to hold that answer.
    pub(super) fn failed(&self, peer: Option<IpAddr>, path: &str) -> Duration {
        UNAUTHORIZED.fetch_add(1, Ordering::Relaxed);
        let now = Instant::now();
        let mut peers = self.peers.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if peers.len() >= MAX_PEERS && !peers.contains_key(&peer) {
            peers.retain(|_, known| now.duration_since(known.last) < FORGET_AFTER);
            if peers.len() >= MAX_PEERS {
                if let Some(oldest) = peers.iter().min_by_key(|(_, known)| known.last).map(|(key, _)| *key) {
                    peers.remove(&oldest);
                }
            }
        }
        let known = peers.entry(peer).or_insert(Peer {
            failures: 0,
            last: now,
            warned: None,
        });
        if now.duration_since(known.last) >= FORGET_AFTER {
            known.failures = 0;
        }
        known.failures = known.failures.saturating_add(1);
        known.last = now;
        if known
            .warned
            .is_none_or(|warned| now.duration_since(warned) >= WARN_EVERY)
        {
            known.warned = Some(now);
            let peer = peer.map_or_else(|| "unknown".to_string(), |peer| peer.to_string());
            tracing::warn!(
                peer,
                path,
                failures = known.failures,
                "an HTTP request had no or a wrong token (logged at most once a minute per peer; see shardcron_http_unauthorized_total)"
            );
        }
        delay_after(known.failures)
    }
}

/// How long the answer of a peer's `failures`-th failure is held.
fn delay_after(failures: u32) -> Duration {
    match failures.checked_sub(FREE_FAILURES + 1) {
        None => Duration::ZERO,
        Some(doublings) => FIRST_DELAY
            .checked_mul(1u32 << doublings.min(16))
            .map_or(MAX_DELAY, |delay| delay.min(MAX_DELAY)),
    }
}

struct Collector;

impl std::fmt::Debug for Collector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FailedTokensCollector")
    }
}

impl prometheus_client::collector::Collector for Collector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let counter = ConstCounter::new(UNAUTHORIZED.load(Ordering::Relaxed));
        let metric = encoder.encode_descriptor(
            "http_unauthorized",
            "HTTP requests answered 401: no token, or a wrong one",
            None,
            MetricType::Counter,
        )?;
        counter.encode(metric)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_few_failures_are_free_then_each_waits_twice_as_long_up_to_the_most() {
        let delays: Vec<u64> = (1..=12)
            .map(|failures| delay_after(failures).as_millis() as u64)
            .collect();
        assert_eq!(delays, [0, 0, 0, 0, 0, 100, 200, 400, 800, 1600, 2000, 2000]);
        assert_eq!(delay_after(u32::MAX), MAX_DELAY);
    }

    #[test]
    fn each_peer_is_slowed_on_its_own() {
        let tokens = FailedTokens::new();
        let guesser = Some(IpAddr::from([192, 0, 2, 1]));
        let other = Some(IpAddr::from([192, 0, 2, 2]));
        let mut last = Duration::ZERO;
        for _ in 0..8 {
            last = tokens.failed(guesser, "/api/v1/status");
        }
        assert_eq!(last, Duration::from_millis(400));
        assert_eq!(tokens.failed(other, "/api/v1/status"), Duration::ZERO);
    }
}
