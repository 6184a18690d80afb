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

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::response::IntoResponse;
use axum::Router;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower_service::Service;

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

/// The paths a probe slot serves.
fn is_probe(path: &str) -> bool {
    matches!(path, "/healthz" | "/readyz" | "/metrics")
}

struct Slots {
    full: Arc<Semaphore>,
    probes: Arc<Semaphore>,
}

/// What a connection holds: one of the `cap` slots, or one kept for probes.
enum Slot {
    Full(#[allow(dead_code)] OwnedSemaphorePermit),
    Probe(#[allow(dead_code)] OwnedSemaphorePermit),
}

impl Slots {
    /// A slot for a new connection: a free one; else, when a connection waits for a request
    /// head, that one is evicted and its slot taken; else a probe slot. Looked at again every
    /// [`EVICT_AGAIN`], so the accept loop never waits on clients that hold every slot.
    /// `None` once `stop`.
    async fn take(&self, open: &Open, stop: &CancellationToken) -> Option<Slot> {
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

/// The address of the client that sent a request, in the request's extensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PeerAddr(pub(crate) std::net::IpAddr);

/// The open connections, each with what its watchdog reads and a way to close it.
#[derive(Default)]
struct Open {
    next_id: AtomicU64,
    /// Each connection's activity, its way to be closed, and whether closing it frees one of
    /// the `cap` slots (a probe slot's connection does not).
    connections: Mutex<HashMap<u64, Listed>>,
}

/// An open connection's activity, its way to be closed, and whether closing it frees a slot.
type Listed = (Arc<Activity>, CancellationToken, bool);

impl Open {
    fn add(&self, activity: Arc<Activity>, frees_a_slot: bool) -> (u64, CancellationToken) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let evict = CancellationToken::new();
        if let Ok(mut connections) = self.connections.lock() {
            connections.insert(id, (activity, evict.clone(), frees_a_slot));
        }
        (id, evict)
    }

    fn remove(&self, id: u64) {
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

/// What a connection's watchdog reads: whether a request is in progress, and when the
/// connection last moved. Shared by the stream wrapper and the service.
struct Activity {
    /// Set while the router handles a request: a slow answer (a `trigger` that waits for its
    /// run) is not an idle connection.
    in_request: AtomicBool,
    /// Milliseconds since `origin` at which the pending request head began (the accept, or
    /// the first byte after a response); `u64::MAX` while none is pending.
    head_started: AtomicU64,
    /// Milliseconds since `origin` of the last byte read or written.
    last_moved: AtomicU64,
    origin: Instant,
}

const NO_HEAD: u64 = u64::MAX;

impl Activity {
    fn new() -> Activity {
        Activity {
            in_request: AtomicBool::new(false),
            // A new connection owes its first request head from the start.
            head_started: AtomicU64::new(0),
            last_moved: AtomicU64::new(0),
            origin: Instant::now(),
        }
    }

    fn now(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(NO_HEAD - 1)
    }

    fn read_some(&self) {
        let now = self.now();
        self.last_moved.store(now, Ordering::Relaxed);
        if !self.in_request.load(Ordering::Relaxed) {
            // The first byte of a request head starts its clock; later bytes do not reset it.
            let _ = self
                .head_started
                .compare_exchange(NO_HEAD, now, Ordering::Relaxed, Ordering::Relaxed);
        }
    }

    fn wrote_some(&self) {
        self.last_moved.store(self.now(), Ordering::Relaxed);
    }

    fn request_began(&self) {
        self.in_request.store(true, Ordering::Relaxed);
        self.head_started.store(NO_HEAD, Ordering::Relaxed);
    }

    fn request_ended(&self) {
        self.last_moved.store(self.now(), Ordering::Relaxed);
        self.in_request.store(false, Ordering::Relaxed);
    }

    /// Why the connection should be closed now, if it should.
    fn overdue(&self) -> Option<&'static str> {
        if self.in_request.load(Ordering::Relaxed) {
            return None;
        }
        let now = self.now();
        let head_started = self.head_started.load(Ordering::Relaxed);
        if head_started != NO_HEAD {
            return (now.saturating_sub(head_started) >= millis(HEADER_TIMEOUT)).then_some("request head too slow");
        }
        let last_moved = self.last_moved.load(Ordering::Relaxed);
        (now.saturating_sub(last_moved) >= millis(IDLE_TIMEOUT)).then_some("idle")
    }

    /// How long the connection has waited for a request head: since the head began, or since
    /// it last moved when idle. Milliseconds, ranked across connections by their own clocks.
    fn waited(&self) -> Duration {
        let now = self.now();
        let since = match self.head_started.load(Ordering::Relaxed) {
            NO_HEAD => self.last_moved.load(Ordering::Relaxed),
            started => started,
        };
        Duration::from_millis(now.saturating_sub(since))
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// What the accept loop hands a connection's task.
struct Connection {
    activity: Arc<Activity>,
    evict: CancellationToken,
    /// On a probe slot: one request, and only a probe's.
    probes_only: bool,
}

async fn serve_watched(stream: TcpStream, app: Router, connection: &Connection, stop: &CancellationToken) {
    let Connection {
        activity,
        evict,
        probes_only,
    } = connection;
    let probes_only = *probes_only;
    // The guard slows a peer that keeps sending wrong tokens: it needs to know who it is.
    let peer = stream.peer_addr().ok().map(|address| PeerAddr(address.ip()));
    let io = TokioIo::new(Watched {
        stream,
        activity: Arc::clone(activity),
    });
    let service = {
        let activity = Arc::clone(activity);
        hyper::service::service_fn(move |mut request: hyper::Request<hyper::body::Incoming>| {
            if let Some(peer) = peer {
                request.extensions_mut().insert(peer);
            }
            let mut app = app.clone();
            let activity = Arc::clone(&activity);
            activity.request_began();
            async move {
                let response = if probes_only && !is_probe(request.uri().path()) {
                    Ok(super::api::Failure::new(
                        axum::http::StatusCode::SERVICE_UNAVAILABLE,
                        "every connection slot is taken; this one serves /healthz, /readyz and /metrics only: try again",
                    )
                    .into_response())
                } else {
                    app.call(request).await
                };
                activity.request_ended();
                response
            }
        })
    };
    let mut builder = hyper::server::conn::http1::Builder::new();
    // The watchdog below keeps the time limits; hyper's own header timeout would also close
    // kept-alive connections after its 10 s.
    builder.header_read_timeout(None).max_buf_size(64 * 1024);
    // A probe slot serves one request: a client cannot keep it with requests back to back.
    builder.keep_alive(!probes_only);
    let connection = builder.serve_connection(io, service);
    tokio::pin!(connection);
    let mut watch = tokio::time::interval(WATCH_EVERY);
    watch.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            result = connection.as_mut() => {
                if let Err(err) = result {
                    tracing::debug!(error = %err, "HTTP connection ended with an error");
                }
                return;
            }
            _ = watch.tick() => {
                if let Some(why) = activity.overdue() {
                    tracing::debug!(why, "closing an HTTP connection");
                    return;
                }
            }
            _ = evict.cancelled() => {
                tracing::debug!("closing an HTTP connection that waited longest: every slot is taken");
                return;
            }
            _ = stop.cancelled() => break,
        }
    }
    connection.as_mut().graceful_shutdown();
    let _ = tokio::time::timeout(STOP_GRACE, connection).await;
}

/// A client's stream that tells its [`Activity`] when bytes move.
struct Watched {
    stream: TcpStream,
    activity: Arc<Activity>,
}

impl AsyncRead for Watched {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.stream).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.read_some();
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.stream).poll_write(cx, buf);
        if matches!(polled, Poll::Ready(Ok(written)) if written > 0) {
            self.activity.wrote_some();
        }
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        if matches!(polled, Poll::Ready(Ok(written)) if written > 0) {
            self.activity.wrote_some();
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

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

    #[test]
    fn a_fresh_connection_owes_its_head_and_a_busy_one_is_never_overdue() {
        let activity = Activity::new();
        assert_eq!(activity.overdue(), None);
        let old = Activity {
            origin: Instant::now()
                .checked_sub(Duration::from_secs(61))
                .expect("a minute after boot"),
            ..Activity::new()
        };
        assert_eq!(old.overdue(), Some("request head too slow"));
        old.request_began();
        assert_eq!(old.overdue(), None, "a request in progress is never cut");
        old.request_ended();
        assert_eq!(old.overdue(), None, "idle for 0 s after its answer");
        old.last_moved.store(50_000, Ordering::Relaxed);
        assert_eq!(old.overdue(), None, "idle 11 s is within the idle limit");
        old.last_moved.store(0, Ordering::Relaxed);
        assert_eq!(old.overdue(), Some("idle"));
    }

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
