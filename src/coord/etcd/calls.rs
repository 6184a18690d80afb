//! One call to etcd within its time limit, and what a cancelled watch means.

use std::future::Future;
use std::time::Duration;

use etcd_client::Client;

use super::error::CoordError;

/// A read of `key` that needs a working, authorised connection: what a node tries once at
/// start, so a refused credential ends the start with a clear error instead of endless retries.
pub async fn probe(client: &Client, key: &str) -> Result<(), CoordError> {
    let options = etcd_client::GetOptions::new().with_keys_only().with_limit(1);
    call(client.clone().get(key, Some(options))).await.map(|_| ())
}

/// How long one unary etcd call may take. A connection cut by a dropping firewall hangs rather
/// than fails, and nothing that guards a tick may wait on it for longer than this.
pub(crate) const CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// Runs an etcd call with [`CALL_TIMEOUT`].
pub(crate) async fn call<T, F>(future: F) -> Result<T, CoordError>
where
    F: Future<Output = Result<T, etcd_client::Error>>,
{
    within(CALL_TIMEOUT, future).await
}

/// Whether etcd no longer holds `lease`. Its answer counts whole seconds left, rounded toward
/// zero: 0 is a lease with less than a second left, or one past its expiry that etcd has not
/// revoked yet, so only a negative answer (not found) says it is gone.
pub(crate) async fn lease_gone(client: &Client, lease: i64) -> Result<bool, CoordError> {
    let answer = call(client.clone().lease_time_to_live(lease, None)).await?;
    Ok(answer.ttl() < 0)
}

/// Runs an etcd call with a timeout of its own.
pub(crate) async fn within<T, F>(limit: Duration, future: F) -> Result<T, CoordError>
where
    F: Future<Output = Result<T, etcd_client::Error>>,
{
    let result = match tokio::time::timeout(limit, future).await {
        Ok(result) => result.map_err(CoordError::from),
        Err(_) => Err(CoordError::Timeout(limit)),
    };
    if result.is_err() {
        crate::metrics::get().etcd_errors.inc();
    }
    result
}

/// Whether etcd cancelled a watch because its start revision was compacted: then the revision
/// to read and watch again from (the first etcd still holds). Any other cancellation is an
/// error: the watch will never deliver again.
pub(crate) fn compacted(response: &etcd_client::WatchResponse, what: &str) -> Result<Option<i64>, CoordError> {
    if !response.canceled() {
        return Ok(None);
    }
    if response.compact_revision() > 0 {
        tracing::info!(
            compacted = response.compact_revision(),
            "the watch of {what} started before etcd's compacted history: reading it again"
        );
        return Ok(Some(response.compact_revision()));
    }
    Err(CoordError::Protocol(format!(
        "etcd cancelled the watch of {what}: {}",
        response.cancel_reason()
    )))
}
