//! One connection: served by hyper, its bytes and requests watched, and closed when its
//! request head is too slow, it idles too long, it is evicted for its slot, or the listener stops.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::response::IntoResponse;
use axum::Router;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;
use tower_service::Service;

use super::{HEADER_TIMEOUT, IDLE_TIMEOUT, STOP_GRACE, WATCH_EVERY};

/// The paths a probe slot serves.
fn is_probe(path: &str) -> bool {
    matches!(path, "/healthz" | "/readyz" | "/metrics")
}

/// The address of the client that sent a request, in the request's extensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PeerAddr(pub(crate) std::net::IpAddr);

/// What a connection's watchdog reads: whether a request is in progress, and when the
/// connection last moved. Shared by the stream wrapper and the service.
pub(super) struct Activity {
    /// Set while the router handles a request: a slow answer (a `trigger` that waits for its
    /// run) is not an idle connection.
    pub(super) in_request: AtomicBool,
    /// Milliseconds since `origin` at which the pending request head began (the accept, or
    /// the first byte after a response); `u64::MAX` while none is pending.
    pub(super) head_started: AtomicU64,
    /// Milliseconds since `origin` of the last byte read or written.
    pub(super) last_moved: AtomicU64,
    pub(super) origin: Instant,
}

const NO_HEAD: u64 = u64::MAX;

impl Activity {
    pub(super) fn new() -> Activity {
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

    pub(super) fn request_began(&self) {
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
    pub(super) fn waited(&self) -> Duration {
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
pub(super) struct Connection {
    pub(super) activity: Arc<Activity>,
    pub(super) evict: CancellationToken,
    /// On a probe slot: one request, and only a probe's.
    pub(super) probes_only: bool,
}

pub(super) async fn serve_watched(stream: TcpStream, app: Router, connection: &Connection, stop: &CancellationToken) {
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
                    Ok(crate::serving::http::api::Failure::new(
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
}
