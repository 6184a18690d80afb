//! The late-run room of a node: caught-up and redelivered ticks take one of a few permits per
//! core to run, and a leader claims more of a backlog only while fewer than [`LATE_ROOM`] of them
//! wait. Live ticks never wait here.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

/// Caught-up and redelivered runs that may go at once on a node, per core: a takeover after a
/// long outage may owe a backlog to every one of 100,000 jobs, and starting them all together
/// would bury the machine (and the node's lease renewals) under processes. Live ticks never wait.
const LATE_RUNS_PER_CORE: usize = 4;

/// How many caught-up and redelivered ticks may wait for a permit on a node before a leader
/// claims more of its backlog: a takeover that owes 100 ticks to each of 100,000 jobs claims and
/// holds them a part at a time, not ten million at once.
pub(super) const LATE_ROOM: usize = 10_000;

/// The permits and the count of late ticks waiting for one.
pub(super) struct LateRoom {
    /// Permits for caught-up and redelivered runs (see [`LATE_RUNS_PER_CORE`]).
    permits: Arc<Semaphore>,
    /// Caught-up and redelivered ticks handed over and not taken up yet (see [`LATE_ROOM`]).
    pub(super) waiting: AtomicUsize,
    /// Told when `waiting` drops below [`LATE_ROOM`].
    room: Notify,
}

/// Room for late ticks held by a leader while it claims them (see [`LateRoom::reserve`]).
pub(crate) struct LateReservation {
    room: Arc<LateRoom>,
    ticks: usize,
}

impl Drop for LateReservation {
    fn drop(&mut self) {
        self.room.release(self.ticks);
    }
}

impl LateRoom {
    pub(super) fn new() -> LateRoom {
        let cores = std::thread::available_parallelism().map_or(2, usize::from);
        LateRoom {
            permits: Arc::new(Semaphore::new(cores * LATE_RUNS_PER_CORE)),
            waiting: AtomicUsize::new(0),
            room: Notify::new(),
        }
    }

    /// `ticks` late ticks were handed over to run.
    pub(super) fn handed_over(&self, ticks: usize) {
        self.waiting.fetch_add(ticks, Ordering::SeqCst);
    }

    /// Whether fewer than [`LATE_ROOM`] late ticks wait.
    pub(super) fn has_room(&self) -> bool {
        self.waiting.load(Ordering::SeqCst) < LATE_ROOM
    }

    /// Waits until [`LateRoom::has_room`].
    pub(super) async fn wait_for_room(&self) {
        loop {
            let notified = self.room.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.has_room() {
                return;
            }
            notified.await;
        }
    }

    /// Holds room for `ticks` late ticks about to be claimed, if fewer than [`LATE_ROOM`] wait:
    /// several shards taking over at once share the room instead of each finding it empty
    /// before any of their runs is counted. The room is held until the reservation is dropped,
    /// by which time the ticks that started are counted as handed over.
    pub(super) fn reserve(self: &Arc<Self>, ticks: usize) -> Option<LateReservation> {
        let mut waiting = self.waiting.load(Ordering::SeqCst);
        loop {
            if waiting >= LATE_ROOM {
                return None;
            }
            match self
                .waiting
                .compare_exchange(waiting, waiting + ticks, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => {
                    return Some(LateReservation {
                        room: Arc::clone(self),
                        ticks,
                    })
                }
                Err(now) => waiting = now,
            }
        }
    }

    fn release(&self, ticks: usize) {
        let before = self.waiting.fetch_sub(ticks, Ordering::SeqCst);
        if before >= LATE_ROOM && before - ticks < LATE_ROOM {
            self.room.notify_waiters();
        }
    }

    /// A late tick's permit, waited for; the tick no longer waits in the room once it holds
    /// one. The semaphore is never closed.
    pub(super) async fn permit(&self) -> Option<OwnedSemaphorePermit> {
        let permit = Arc::clone(&self.permits).acquire_owned().await.ok();
        self.release(1);
        permit
    }
}
