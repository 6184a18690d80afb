//! A node's etcd session: one lease for all its shard campaigns, kept alive by one task.
//!
//! The session knows, from its own clock, until when etcd must still hold the lease: the send
//! time of the last renewal that etcd answered, plus the TTL. Past that instant the node may no
//! longer act as a leader even if no error has reached it yet; this is what stops a node that
//! was frozen (SIGSTOP, a long GC-like stall) or cut off from firing a stale tick when it wakes.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::Client;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::coord::etcd::{self, CoordError};

/// A live lease. Cheap to clone; all clones share one keep-alive task.
#[derive(Clone)]
pub struct Session {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    lease: i64,
    purpose: Purpose,
    ttl: Duration,
    valid_until: Mutex<Instant>,
    /// A child of the node's shutdown token, cancelled too when the lease is lost or the session
    /// closed: every campaign and term of the session ends with it.
    ended: CancellationToken,
    /// Cancelled only when the lease is lost or released. A shutdown does not touch it: the lease
    /// is kept alive until the node closes the session, so ticks claimed before a shutdown still
    /// start.
    released: CancellationToken,
}

/// What a lease is for: its loss is told as such.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Purpose {
    /// The node's campaigns and terms.
    Elections,
    /// The slots of concurrency groups this node's runs hold, their places in line, and the
    /// runs it lists as going in their jobs' records.
    Slots,
}

impl Session {
    /// Grants a lease and starts keeping it alive until the lease is lost, the session closed or
    /// `shutdown` cancelled.
    pub async fn open(client: &Client, ttl: Duration, shutdown: &CancellationToken) -> Result<Session, CoordError> {
        Session::open_for(client, ttl, shutdown, Purpose::Elections).await
    }

    /// [`Session::open`], for `purpose`.
    pub(crate) async fn open_for(
        client: &Client,
        ttl: Duration,
        shutdown: &CancellationToken,
        purpose: Purpose,
    ) -> Result<Session, CoordError> {
        let started = Instant::now();
        let granted = etcd::call(client.clone().lease_grant(ttl.as_secs() as i64, None)).await?;
        let ttl = Duration::from_secs(granted.ttl().max(1) as u64);
        let session = Session {
            inner: Arc::new(Inner {
                client: client.clone(),
                lease: granted.id(),
                purpose,
                ttl,
                valid_until: Mutex::new(started + ttl),
                ended: shutdown.child_token(),
                released: CancellationToken::new(),
            }),
        };
        tokio::spawn(session.clone().keep_alive());
        Ok(session)
    }

    pub fn lease(&self) -> i64 {
        self.inner.lease
    }

    pub fn ttl(&self) -> Duration {
        self.inner.ttl
    }

    pub fn client(&self) -> Client {
        self.inner.client.clone()
    }

    /// Cancelled once the lease is lost, the session closed or the node shut down.
    pub fn ended(&self) -> &CancellationToken {
        &self.inner.ended
    }

    /// How long etcd still holds the lease by this node's own clock.
    pub fn remaining(&self) -> Duration {
        if self.inner.released.is_cancelled() {
            return Duration::ZERO;
        }
        self.valid_until().saturating_duration_since(Instant::now())
    }

    /// Whether etcd still holds the lease by this node's own clock.
    pub fn is_live(&self) -> bool {
        !self.inner.released.is_cancelled() && Instant::now() < self.valid_until()
    }

    /// Like [`Session::is_live`], and a lease that may have expired by this node's own clock ends
    /// the session: the node campaigns again with a new lease rather than keep election keys
    /// that lead shards with no term behind them, should a late renewal keep the old lease.
    pub fn check_live(&self) -> bool {
        if self.is_live() {
            return true;
        }
        self.lose(
            "the lease may have expired by this node's own clock",
            "expired_by_own_clock",
        );
        false
    }

    /// Until when etcd still holds the lease by this node's own clock.
    pub fn valid_until(&self) -> Instant {
        *self
            .inner
            .valid_until
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn renewed(&self, sent_at: Instant) {
        let mut valid_until = self
            .inner
            .valid_until
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        *valid_until = (*valid_until).max(sent_at + self.inner.ttl);
    }

    fn lose(&self, why: &str, cause: &'static str) {
        if !self.inner.released.is_cancelled() {
            let lease = format!("{:x}", self.inner.lease);
            // The whole node's, whichever run or term noticed it first: outside their spans.
            match self.inner.purpose {
                Purpose::Elections => {
                    let metrics = crate::metrics::get();
                    metrics.session_losses.inc();
                    metrics
                        .session_losses_by_cause
                        .get_or_create(&crate::metrics::CauseLabel { cause })
                        .inc();
                    tracing::warn!(parent: None, lease, reason = why, cause, "session lost: every shard term of this node ends");
                }
                Purpose::Slots => {
                    tracing::warn!(parent: None, lease, reason = why, cause, "the lease of this node's runs is lost: the runs holding a group slot or listed as going on it are stopped");
                }
            }
            self.inner.released.cancel();
            self.inner.ended.cancel();
        }
    }

    /// Revokes the lease, which deletes every election key of this node at once so that other
    /// nodes take over without waiting for the TTL. Bounded by the TTL. Returns whether etcd
    /// confirmed it: an etcd that was out of reach may still hold the lease when it returns (etcd
    /// gives leases a fresh TTL after an election), so the caller revokes it again later.
    pub async fn close(&self) -> bool {
        self.inner.released.cancel();
        self.inner.ended.cancel();
        match revoke(&self.inner.client, self.inner.lease, self.inner.ttl).await {
            Ok(()) => {
                tracing::info!(lease = format!("{:x}", self.inner.lease), "lease revoked");
                true
            }
            Err(err) => {
                tracing::warn!(lease = format!("{:x}", self.inner.lease), error = %err, "could not revoke the lease; revoking it again once etcd answers");
                false
            }
        }
    }

    /// Renews about every TTL/5. Ends the session when etcd says the lease is gone or when no
    /// renewal succeeded within the TTL.
    ///
    /// A renewal that etcd has not answered after [`hedge_after`] is raced by another, on a
    /// stream opened anew, and so on up to [`RACING_RENEWALS`] at once; the first answer wins.
    /// A member stalled, or one forwarding renewals to a raft leader that stalled or was cut
    /// off (which waits out etcd's request timeout, longer than the lease), would otherwise
    /// hold the renewal past the lease: the new stream goes to the member calls go to now, and
    /// asks the new raft leader once one is elected. The first attempt is never given up for a
    /// later one, so an etcd that is merely slow (a round trip longer than the hedge) still
    /// renews. etcd elects a leader within one to two election timeouts (1 s by default);
    /// renewing every fifth of the TTL rather than every third leaves that much more of the
    /// lease for it.
    async fn keep_alive(self) {
        let interval = (self.inner.ttl / 5).max(Duration::from_millis(200));
        let hedge = hedge_after(self.inner.ttl);
        let lease = self.inner.lease;
        let mut stream = None;
        let mut next = Instant::now() + interval;
        loop {
            tokio::select! {
                _ = self.inner.released.cancelled() => return,
                _ = tokio::time::sleep_until(next) => {}
            }
            next = Instant::now() + interval;
            if Instant::now() >= self.valid_until() {
                self.lose("no renewal succeeded within the lease TTL", "renewal_timed_out");
                return;
            }
            let mut attempts = tokio::task::JoinSet::new();
            attempts.spawn(renewal(self.inner.client.clone(), lease, stream.take()));
            let mut hedge_at = Instant::now() + hedge;
            let mut failure = None;
            let renewed = loop {
                tokio::select! {
                    _ = self.inner.released.cancelled() => return,
                    // What is left of the lease bounds the round: a hung connection is
                    // noticed before the lease could have expired.
                    _ = tokio::time::sleep_until(self.valid_until()) => break None,
                    _ = tokio::time::sleep_until(hedge_at), if attempts.len() < RACING_RENEWALS => {
                        if let Some(left_out) = crate::repeats::log_now("lease renewal raced") {
                            tracing::warn!(lease = format!("{lease:x}"), after = ?hedge, left_out, "lease renewal not answered yet; racing it with another on a new stream (left_out: lines like this one not logged since the last)");
                        }
                        attempts.spawn(renewal(self.inner.client.clone(), lease, None));
                        hedge_at += hedge;
                    }
                    joined = attempts.join_next() => match joined {
                        Some(Ok(Renewal { sent_at, answer: Ok(Some(response)), stream: kept })) => break Some((sent_at, response, kept)),
                        Some(Ok(Renewal { answer, .. })) => {
                            failure = Some(match answer {
                                Ok(_) => "lease keep-alive stream closed by etcd".to_owned(),
                                Err(err) => err.to_string(),
                            });
                            if attempts.is_empty() {
                                break None;
                            }
                        }
                        Some(Err(_)) | None => break None,
                    },
                }
            };
            match renewed {
                Some((sent_at, response, kept)) if response.ttl() > 0 => {
                    self.renewed(sent_at);
                    stream = kept;
                    tracing::debug!(lease = format!("{lease:x}"), ttl = response.ttl(), "lease renewed");
                }
                Some(_) => {
                    self.lose("etcd reports the lease expired", "lease_gone");
                    return;
                }
                None => {
                    crate::metrics::get().etcd_errors.inc();
                    let why = failure.unwrap_or_else(|| "not answered within what was left of the lease".to_owned());
                    tracing::warn!(lease = format!("{lease:x}"), error = %why, "lease renewal failed; retrying");
                    next = Instant::now() + interval.min(Duration::from_millis(300));
                }
            }
        }
    }
}

/// At most this many renewals of one round race each other.
const RACING_RENEWALS: usize = 4;

/// How long a renewal goes unanswered before another races it: an eighth of the TTL, within
/// 250 ms and 2 s.
fn hedge_after(ttl: Duration) -> Duration {
    (ttl / 8).clamp(Duration::from_millis(250), Duration::from_secs(2))
}

/// One renewal attempt: when it was sent, etcd's answer, and its stream to keep if it won.
struct Renewal {
    sent_at: Instant,
    answer: Result<Option<etcd_client::LeaseKeepAliveResponse>, etcd_client::Error>,
    stream: KeepAliveStream,
}

/// Renews `lease` once on `stream` (a new one if `None`).
async fn renewal(client: Client, lease: i64, mut stream: KeepAliveStream) -> Renewal {
    let sent_at = Instant::now();
    let answer = renew_once(&client, lease, &mut stream).await;
    Renewal {
        sent_at,
        answer,
        stream,
    }
}

/// A lease's keep-alive stream, opened on the first renewal and again after a failure.
pub(crate) type KeepAliveStream = Option<(etcd_client::LeaseKeeper, etcd_client::LeaseKeepAliveStream)>;

/// Renews `lease` once on `stream`, opening it first if needed; `None` when etcd closed it. A
/// failed renewal leaves no stream, so the next one opens a new one.
pub(crate) async fn renew_once(
    client: &Client,
    lease: i64,
    stream: &mut KeepAliveStream,
) -> Result<Option<etcd_client::LeaseKeepAliveResponse>, etcd_client::Error> {
    let opened = match stream.take() {
        Some(opened) => opened,
        None => client.clone().lease_keep_alive(lease).await?,
    };
    let (keeper, responses) = stream.insert(opened);
    keeper.keep_alive().await?;
    responses.message().await
}

/// Revokes `lease` within `limit`. A lease etcd no longer knows counts as revoked.
pub async fn revoke(client: &Client, lease: i64, limit: Duration) -> Result<(), CoordError> {
    match etcd::within(limit, client.clone().lease_revoke(lease)).await {
        Err(CoordError::Etcd(etcd_client::Error::GRpcStatus(status))) if status.code() == tonic::Code::NotFound => {
            Ok(())
        }
        result => result.map(|_| ()),
    }
}
