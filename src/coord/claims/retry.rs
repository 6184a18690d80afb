//! What a failed etcd call costs a term: a pause and another try while its session lasts, an
//! immediate retry after etcd's raft leader changed, or the term's end.

use std::time::Duration;

use super::{Claimer, Halt};
use crate::backoff::{sleep_or_cancel, Backoff};
use crate::coord::election;
use crate::coord::etcd::CoordError;

/// Pause between attempts when etcd fails a call during a term.
const RETRY_PAUSE: Duration = Duration::from_millis(200);

impl Claimer<'_> {
    /// Confirms, with a linearizable read, that this leadership still leads: what lets a tick
    /// claimed ahead start on time. A leader cut off from etcd since its claim does not start it,
    /// so the next leader can deliver it without running it twice. Retries a failed read while
    /// the session lasts.
    pub(crate) async fn confirm(&self) -> Result<(), Halt> {
        loop {
            match election::still_leads(self.session, self.leadership).await {
                Ok(true) => return Ok(()),
                Ok(false) => return Err(Halt::Deposed),
                Err(err) => self.pause_after(&err).await?,
            }
        }
    }

    /// Retries an etcd read until it succeeds or the term must end.
    pub(crate) async fn retry<T, F, Fut>(&self, mut call: F) -> Result<T, Halt>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, CoordError>>,
    {
        loop {
            match call().await {
                Ok(value) => return Ok(value),
                Err(err) => self.pause_after(&err).await?,
            }
        }
    }

    pub(super) async fn pause_after(&self, err: &CoordError) -> Result<(), Halt> {
        // etcd elected a new raft leader while the claim waited: it goes again at once, so a
        // leader change costs a tick one claim's delay and no pause (#44).
        if err.is_leader_change() && self.session.check_live() {
            tracing::info!(error = %err, "etcd's raft leader changed under a claim: sending it again at once");
            return Ok(());
        }
        if err.is_nospace() {
            tracing::debug!(error = %err, "etcd is out of space: the claim waits");
        } else if let Some(left_out) = crate::repeats::log_now("etcd call failed during a term") {
            tracing::warn!(error = %err, left_out, "etcd call failed during the term; retrying (left_out: lines like this one not logged since the last)");
        }
        let pause = Backoff::new(RETRY_PAUSE, RETRY_PAUSE).next_delay();
        if !sleep_or_cancel(pause, self.session.ended()).await {
            return Err(if self.shutdown.is_cancelled() {
                Halt::Stopped
            } else {
                Halt::SessionLost
            });
        }
        if self.session.check_live() {
            Ok(())
        } else {
            Err(Halt::SessionLost)
        }
    }
}
