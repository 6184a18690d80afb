//! Who gets a connection slot: a free one; else the slot of the connection that has waited
//! longest for a request head, closed to make room; else one kept for probes.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use super::connection::Activity;
use super::EVICT_AGAIN;

pub(super) struct Slots {
    pub(super) full: Arc<Semaphore>,
    pub(super) probes: Arc<Semaphore>,
}

/// What a connection holds: one of the `cap` slots, or one kept for probes.
pub(super) enum Slot {
    Full(#[allow(dead_code)] OwnedSemaphorePermit),
    Probe(#[allow(dead_code)] OwnedSemaphorePermit),
}

impl Slots {
    /// A slot for a new connection: a free one; else, when a connection waits for a request
    /// head, that one is evicted and its slot taken; else a probe slot. Looked at again every
    /// [`EVICT_AGAIN`], so the accept loop never waits on clients that hold every slot.
    /// `None` once `stop`.
    pub(super) async fn take(&self, open: &Open, stop: &CancellationToken) -> Option<Slot> {
        loop {
            if let Ok(slot) = Arc::clone(&self.full).try_acquire_owned() {
                return Some(Slot::Full(slot));
            }
            // A connection closing for an earlier eviction frees a slot soon: closing more
            // would cut clients for nothing, and hold their descriptors while they close.
            let evicted = open.evicting() || open.evict_longest_waiting();
            if !evicted {
                if let Ok(slot) = Arc::clone(&self.probes).try_acquire_owned() {
                    return Some(Slot::Probe(slot));
                }
            }
            tokio::select! {
                slot = Arc::clone(&self.full).acquire_owned() => return slot.ok().map(Slot::Full),
                _ = tokio::time::sleep(EVICT_AGAIN) => {}
                _ = stop.cancelled() => return None,
            }
        }
    }
}

/// The open connections, each with what its watchdog reads and a way to close it.
#[derive(Default)]
pub(super) struct Open {
    next_id: AtomicU64,
    /// Each connection's activity, its way to be closed, and whether closing it frees one of
    /// the `cap` slots (a probe slot's connection does not).
    connections: Mutex<HashMap<u64, Listed>>,
}

/// An open connection's activity, its way to be closed, and whether closing it frees a slot.
type Listed = (Arc<Activity>, CancellationToken, bool);

impl Open {
    pub(super) fn add(&self, activity: Arc<Activity>, frees_a_slot: bool) -> (u64, CancellationToken) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let evict = CancellationToken::new();
        if let Ok(mut connections) = self.connections.lock() {
            connections.insert(id, (activity, evict.clone(), frees_a_slot));
        }
        (id, evict)
    }

    pub(super) fn remove(&self, id: u64) {
        if let Ok(mut connections) = self.connections.lock() {
            connections.remove(&id);
        }
    }

    /// Whether a connection evicted for its slot has not closed yet.
    fn evicting(&self) -> bool {
        self.connections.lock().is_ok_and(|connections| {
            connections
                .values()
                .any(|(_, evict, frees_a_slot)| *frees_a_slot && evict.is_cancelled())
        })
    }

    /// Closes the connection not in a request that has waited longest for its next request
    /// head, if there is one; whether there was.
    fn evict_longest_waiting(&self) -> bool {
        let Ok(connections) = self.connections.lock() else {
            return false;
        };
        let longest = connections
            .values()
            .filter(|(activity, evict, frees_a_slot)| {
                *frees_a_slot && !evict.is_cancelled() && !activity.in_request.load(Ordering::Relaxed)
            })
            .max_by_key(|(activity, _, _)| activity.waited());
        if let Some((_, evict, _)) = longest {
            evict.cancel();
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    #[test]
    fn at_the_cap_the_longest_wait_for_a_request_gives_way() {
        let open = Open::default();
        let at = |seconds_ago: u64| {
            Arc::new(Activity {
                origin: Instant::now()
                    .checked_sub(Duration::from_secs(seconds_ago))
                    .expect("after boot"),
                ..Activity::new()
            })
        };
        let (busy, newest, oldest) = (at(30), at(1), at(5));
        busy.request_began();
        let (_, busy_evict) = open.add(busy, true);
        let (_, newest_evict) = open.add(newest, true);
        let (oldest_id, oldest_evict) = open.add(oldest, true);
        let (_, probe_evict) = open.add(at(60), false);
        assert!(open.evict_longest_waiting());
        assert!(oldest_evict.is_cancelled());
        assert!(!newest_evict.is_cancelled() && !busy_evict.is_cancelled());
        open.remove(oldest_id);
        assert!(open.evict_longest_waiting());
        assert!(newest_evict.is_cancelled());
        assert!(!busy_evict.is_cancelled(), "a connection in a request is never evicted");
        assert!(!open.evict_longest_waiting());
        assert!(
            !probe_evict.is_cancelled(),
            "a probe slot's connection frees no slot: never evicted for one"
        );
    }
}
