//! The heavy reads (`status`, `jobs`, `plan`) a few at a time, and the status answer cached.
//!
//! A status read walks every job record in etcd; a plan of `for=100y` walks 10,000 fires. Any
//! client may ask for them, and dashboards poll: unbounded, a few dozen at once took a node
//! from 158 MB to 709 MB resident. So they take one of [`PERMITS`] permits, and a status answer
//! is kept for [`STATUS_FRESH_FOR`]: every caller in that second gets the same bytes, computed
//! once while the others wait for it. At most [`WAITERS`] reads wait for a permit; the rest
//! are answered 503 at once.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::StatusCode;
use tokio::sync::{Mutex, Semaphore, SemaphorePermit};

use super::api::Failure;

/// Heavy reads in progress at once on a node.
pub(super) const PERMITS: usize = 4;
/// How long a read waits for a permit before it is answered 503.
const PERMIT_WAIT: Duration = Duration::from_secs(10);
/// At most this many reads wait for a permit; more are answered 503 at once. Unbounded,
/// every connection a client opens could sit in a read for [`PERMIT_WAIT`], and clients that
/// pipeline reads would hold every connection slot.
pub(super) const WAITERS: usize = 16;
/// How long a status answer is served again.
pub(super) const STATUS_FRESH_FOR: Duration = Duration::from_secs(1);

pub(super) struct Reads {
    permits: Semaphore,
    /// A place among the reads that run or wait: [`PERMITS`] + [`WAITERS`].
    places: Semaphore,
    /// The status answer with jobs, and the one without them (`?jobs=false`).
    status: [Arc<Mutex<Cached>>; 2],
}

/// A heavy read's permit, and its place among the reads that run or wait.
pub(super) struct Permit<'a>(
    #[allow(dead_code)] SemaphorePermit<'a>,
    #[allow(dead_code)] SemaphorePermit<'a>,
);

/// A status answer and when it was read.
type Cached = Option<(Instant, Bytes)>;

impl Default for Reads {
    fn default() -> Self {
        Reads {
            permits: Semaphore::new(PERMITS),
            places: Semaphore::new(PERMITS + WAITERS),
            status: [Arc::default(), Arc::default()],
        }
    }
}

impl Reads {
    /// A permit for one heavy read, or 503 if none came free in time, or at once when
    /// [`WAITERS`] reads wait already.
    pub(super) async fn permit(&self) -> Result<Permit<'_>, Failure> {
        let busy = || {
            Failure::new(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("too many reads at once (at most {PERMITS}, and {WAITERS} waiting); try again"),
            )
        };
        let place = self.places.try_acquire().map_err(|_| busy())?;
        match tokio::time::timeout(PERMIT_WAIT, self.permits.acquire()).await {
            Ok(Ok(permit)) => Ok(Permit(place, permit)),
            _ => Err(busy()),
        }
    }

    /// The status answer (with jobs or not) from the last second, or a new one from `read`,
    /// which runs once however many callers wait for it.
    pub(super) async fn status<F>(&self, with_jobs: bool, read: F) -> Result<Bytes, Failure>
    where
        F: Future<Output = Result<Bytes, Failure>>,
    {
        let mut cached = self.status[usize::from(with_jobs)].lock().await;
        if let Some((at, body)) = cached.as_ref() {
            if at.elapsed() < STATUS_FRESH_FOR {
                return Ok(body.clone());
            }
        }
        // The old answer goes before the new one is read: two of them at 100,000 jobs are
        // tens of megabytes.
        *cached = None;
        let _permit = self.permit().await?;
        let body = read.await?;
        let at = Instant::now();
        *cached = Some((at, body.clone()));
        // Dropped once stale rather than at the next call: at 100,000 jobs it is tens of
        // megabytes, and the next call may never come.
        let slot = Arc::clone(&self.status[usize::from(with_jobs)]);
        tokio::spawn(async move {
            tokio::time::sleep(STATUS_FRESH_FOR).await;
            let mut cached = slot.lock().await;
            if cached.as_ref().is_some_and(|(stored, _)| *stored == at) {
                *cached = None;
            }
        });
        Ok(body)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use super::*;

    #[tokio::test]
    async fn concurrent_status_callers_share_one_read() {
        let reads = Arc::new(Reads::default());
        let computed = Arc::new(AtomicUsize::new(0));
        let mut callers = Vec::new();
        for _ in 0..20 {
            let (reads, computed) = (Arc::clone(&reads), Arc::clone(&computed));
            callers.push(tokio::spawn(async move {
                reads
                    .status(true, async {
                        computed.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        Ok(Bytes::from_static(b"{}"))
                    })
                    .await
                    .map_err(|_| ())
            }));
        }
        for caller in callers {
            assert_eq!(caller.await.unwrap(), Ok(Bytes::from_static(b"{}")));
        }
        assert_eq!(computed.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn reads_past_the_waiters_are_refused_at_once() {
        let reads = Arc::new(Reads::default());
        let mut held = Vec::new();
        for _ in 0..PERMITS {
            held.push(reads.permit().await.map_err(|_| ()).expect("a free permit"));
        }
        let mut waiting = Vec::new();
        for _ in 0..WAITERS {
            let reads = Arc::clone(&reads);
            waiting.push(tokio::spawn(async move { reads.permit().await.is_ok() }));
        }
        while reads.places.available_permits() > 0 {
            tokio::task::yield_now().await;
        }
        let started = Instant::now();
        assert!(reads.permit().await.is_err(), "one read too many");
        assert!(started.elapsed() < Duration::from_secs(1), "refused at once");
        drop(held);
        for waiter in waiting {
            assert!(waiter.await.unwrap(), "the waiters get their permits");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_stale_answer_is_dropped_without_another_call() {
        let reads = Reads::default();
        let body = reads.status(true, async { Ok(Bytes::from_static(b"{}")) }).await;
        assert!(body.is_ok());
        assert!(reads.status[1].lock().await.is_some());
        tokio::time::sleep(STATUS_FRESH_FOR + Duration::from_millis(10)).await;
        // Let the dropping task take the lock.
        tokio::task::yield_now().await;
        assert!(reads.status[1].lock().await.is_none());
    }
}
