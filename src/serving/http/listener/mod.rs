//! The accept loop: a cap on open connections, and a time limit on every connection that holds
//! a slot without a request in progress.
//!
//! `axum::serve` keeps every connection a client opens for as long as the client likes; a few
//! hundred idle ones fill the node's descriptor table and every run then fails to spawn. Here at
//! most `cap` connections are open (one more for a moment while a slot is being freed, and
//! [`PROBE_SLOTS`] for probes), and a
//! watchdog closes a connection whose request head takes longer than [`HEADER_TIMEOUT`] or that
//! sits idle between requests longer than [`IDLE_TIMEOUT`]. When a client connects while every
//! slot is taken, the connection that has waited longest for a request head is closed to make
//! room: a client that sends its request at once (a probe, a dashboard) is served, and idle or
//! slow clients cannot keep it in the kernel's queue. When every connection is in a request
//! (clients that pipeline reads back to back), none can be evicted: the new connection then
//! takes one of [`PROBE_SLOTS`] slots kept beyond the cap, which answers one `/healthz`,
//! `/readyz` or `/metrics` (anything else 503), and eviction is tried again every
//! [`EVICT_AGAIN`] instead of the accept loop waiting for a busy client to leave.
//!
//! - `slots`: which connection gets a slot, and which gives its slot up, when all are taken.
//! - `connection`: one connection served, watched and closed when it overstays.

mod connection;
mod slots;

pub(crate) use connection::PeerAddr;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use connection::{serve_watched, Activity, Connection};
use slots::{Open, Slot, Slots};

/// How long a client has to send a whole request head, counted from the connection's accept
/// or from the first byte of a later request.
pub(crate) const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a kept-alive connection may wait for its next request.
pub(crate) const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// How often a connection's watchdog looks at it.
const WATCH_EVERY: Duration = Duration::from_millis(250);
/// How long open requests may go on once the listener stops.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// The connection cap when none is asked for.
pub const DEFAULT_MAX_CONNECTIONS: usize = 256;

/// The cap the listener keeps to: `asked`, but at most half the soft descriptor limit, so
/// clients can never take the descriptors runs and etcd need. Never below 1.
pub fn connection_cap(asked: usize, soft_limit: Option<u64>) -> usize {
    let share = soft_limit.map_or(usize::MAX, |limit| usize::try_from(limit / 2).unwrap_or(usize::MAX));
    asked.min(share).max(1)
}

/// Serves `app` on `listener` with at most `cap` open connections (and [`PROBE_SLOTS`] more
/// for probes) until `stop`, then lets open requests finish for up to [`STOP_GRACE`].
pub(crate) async fn run(listener: TcpListener, app: Router, cap: usize, stop: CancellationToken) {
    let slots = Slots {
        full: Arc::new(Semaphore::new(cap)),
        probes: Arc::new(Semaphore::new(PROBE_SLOTS)),
    };
    let open = Arc::new(Open::default());
    let connections = TaskTracker::new();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stop.cancelled() => break,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(err) => {
                // Out of descriptors (or a connection reset before it was taken): waiting a
                // moment lets runs and clients give some back instead of spinning on accept.
                tracing::warn!(error = %err, "the HTTP listener could not accept a connection");
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                    _ = stop.cancelled() => break,
                }
                continue;
            }
        };
        let Some(slot) = slots.take(&open, &stop).await else {
            break;
        };
        // Listed before its task runs: the next accept must see it to evict it, or it would
        // take a probe slot for want of a connection to evict.
        let activity = Arc::new(Activity::new());
        let probes_only = matches!(slot, Slot::Probe(_));
        let (id, evict) = open.add(Arc::clone(&activity), !probes_only);
        let watched = Connection {
            activity,
            evict,
            probes_only,
        };
        let open = Arc::clone(&open);
        let (app, stop) = (app.clone(), stop.clone());
        connections.spawn(async move {
            let _slot = slot;
            serve_watched(stream, app, &watched, &stop).await;
            open.remove(id);
        });
    }
    connections.close();
    connections.wait().await;
}

/// Connections beyond the cap kept for `/healthz`, `/readyz` and `/metrics`: clients that are
/// always in a request (pipelined reads, back to back) can hold every slot, and none of them
/// is ever waiting to be evicted. A connection on one of these is answered one probe and
/// closed; any other request on it is 503.
pub(crate) const PROBE_SLOTS: usize = 4;
/// How often a listener with every slot taken looks again for a connection to evict.
const EVICT_AGAIN: Duration = Duration::from_millis(50);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_keeps_half_the_descriptors_for_the_node() {
        assert_eq!(connection_cap(256, Some(65_536)), 256);
        assert_eq!(connection_cap(256, Some(200)), 100);
        assert_eq!(connection_cap(256, None), 256);
        assert_eq!(connection_cap(10_000, Some(1_024)), 512);
        assert_eq!(connection_cap(5, Some(1)), 1);
    }
}
