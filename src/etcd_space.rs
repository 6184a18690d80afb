//! etcd's space: its history compacted by one node of the fleet, and its database size, quota
//! and NOSPACE alarm followed by every node.
//!
//! etcd keeps every revision of every key until someone compacts its history. Claims, results
//! and elections write several revisions a second, so an etcd nobody compacts grows until its
//! quota raises the NOSPACE alarm, and from then on refuses every write: no claim, no lease.
//! Kubernetes' API server compacts its etcd itself; a dedicated etcd does so only if its
//! operator set `--auto-compaction-retention`. So the node that leads shard 0 compacts, every
//! `[etcd] compaction`, to the revision it saw one interval earlier: the history etcd keeps is
//! always at least that long, far longer than any watch of ours needs between its read and its
//! start (and a watch that still finds its revision compacted reads its prefix again).

use std::time::Duration;

use etcd_client::Client;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::backoff::sleep_or_cancel;
use crate::etcd::{self, CoordError};
use crate::fleet::FleetView;
use crate::readiness::Readiness;
use crate::session::Session;

/// The shard whose leader compacts: one node at a time, and another within a TTL of its death.
const COMPACTING_SHARD: u32 = 0;

/// Compacts etcd's history every `every` while this node leads shard 0, to the revision it saw
/// `every` before. Ends with the session.
pub(crate) async fn compact(session: Session, node_id: String, every: Duration, view: watch::Receiver<FleetView>) {
    let mut seen: Option<i64> = None;
    loop {
        let leads = view
            .borrow()
            .leaders
            .get(COMPACTING_SHARD as usize)
            .and_then(Option::as_ref)
            .is_some_and(|(leader, _)| *leader == node_id);
        if !leads {
            // A node that leads again starts over: the revision it saw before may be any age.
            seen = None;
        } else {
            match revision_now(&session.client()).await {
                Ok(now) => {
                    if let Some(revision) = seen.filter(|revision| *revision < now) {
                        compact_to(&session.client(), revision).await;
                    }
                    seen = Some(now);
                }
                Err(err) => {
                    tracing::debug!(error = %err, "cannot read etcd's revision to compact its history; trying at the next interval")
                }
            }
        }
        if !sleep_or_cancel(every, session.ended()).await {
            return;
        }
    }
}

async fn revision_now(client: &Client) -> Result<i64, CoordError> {
    let status = etcd::call(client.clone().status()).await?;
    status
        .header()
        .map(|header| header.revision())
        .ok_or_else(|| CoordError::Protocol("a status answer without a header".into()))
}

async fn compact_to(client: &Client, revision: i64) {
    match etcd::call(client.clone().compact(revision, None)).await {
        Ok(_) => tracing::debug!(revision, "compacted etcd's history"),
        // Another node (a leader of shard 0 a moment ago) or etcd's own auto compaction got
        // there first: the history is as short as wanted.
        Err(err) if err.to_string().contains("compacted") => {
            tracing::debug!(revision, error = %err, "etcd's history was already compacted past this revision")
        }
        Err(err) => {
            tracing::debug!(revision, error = %err, "cannot compact etcd's history; trying at the next interval")
        }
    }
}

/// How often every node reads etcd's size and alarms. The NOSPACE alarm is seen within this.
const STATUS_EVERY: Duration = Duration::from_secs(2);

/// etcd's quota is read from its `/metrics` page (etcd before 3.6 does not say it in the
/// endpoint status) at most this often: it changes only with a restart of etcd.
const QUOTA_EVERY: Duration = Duration::from_secs(60);

/// What one look at etcd found.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
struct Space {
    db: i64,
    in_use: i64,
    nospace: bool,
}

/// Follows etcd's database size, in-use size, quota and NOSPACE alarm until `shutdown`: the
/// metrics say them, and while the alarm is raised `/readyz` answers 503 with the reason and the
/// node warns once (not once per refused claim).
pub(crate) async fn follow(client: Client, endpoints: Vec<String>, readiness: Readiness, shutdown: CancellationToken) {
    let metrics = crate::metrics::get();
    let mut alarmed = false;
    let mut quota_read_at: Option<tokio::time::Instant> = None;
    loop {
        match look(&client).await {
            Ok(space) => {
                metrics.etcd_db_bytes.set(space.db);
                metrics.etcd_db_in_use_bytes.set(space.in_use);
                metrics.etcd_nospace.set(i64::from(space.nospace));
                if space.nospace != alarmed {
                    alarmed = space.nospace;
                    if alarmed {
                        tracing::warn!(db_bytes = space.db, in_use_bytes = space.in_use, "etcd raised its NOSPACE alarm: it refuses every write, so no tick is claimed until an operator frees space (compact, defragment) and disarms the alarm (etcdctl alarm disarm)");
                        readiness.set_blocked(Some(format!(
                            "etcd out of space: its NOSPACE alarm is raised (database {} bytes); no tick is claimed until space is freed and the alarm disarmed",
                            space.db
                        )));
                    } else {
                        tracing::info!("etcd's NOSPACE alarm is disarmed; claiming again");
                        readiness.set_blocked(None);
                    }
                }
            }
            Err(err) => tracing::debug!(error = %err, "cannot read etcd's status and alarms"),
        }
        if quota_read_at.is_none_or(|at| at.elapsed() >= QUOTA_EVERY) {
            if let Some(quota) = quota(&client, &endpoints).await {
                metrics.etcd_quota_bytes.set(quota);
                quota_read_at = Some(tokio::time::Instant::now());
            }
        }
        if !sleep_or_cancel(STATUS_EVERY, &shutdown).await {
            return;
        }
    }
}

/// One endpoint status: its member's sizes, and the cluster's alarms among its errors
/// (`memberID:... alarm:NOSPACE`). Not the alarm RPC: etcd sends even a read of the alarms
/// through raft, a proposal per node every few seconds.
async fn look(client: &Client) -> Result<Space, CoordError> {
    let status = etcd::call(client.clone().status()).await?;
    Ok(Space {
        db: status.db_size(),
        in_use: status.raft_used_db_size(),
        nospace: status.errors().iter().any(|error| error.contains("NOSPACE")),
    })
}

/// etcd's `--quota-backend-bytes`: from the endpoint status where etcd says it (3.6 on), else
/// the `etcd_server_quota_backend_bytes` gauge of the first plain-HTTP endpoint's `/metrics`.
/// `None` when neither says it (an etcd behind TLS before 3.6): the gauge then stays 0.
async fn quota(client: &Client, endpoints: &[String]) -> Option<i64> {
    if let Ok(status) = etcd::call(client.clone().status()).await {
        if status.db_size_quota() > 0 {
            return Some(status.db_size_quota());
        }
    }
    for endpoint in endpoints {
        let Some(address) = endpoint.trim().strip_prefix("http://") else {
            continue;
        };
        let address = address.split('/').next().unwrap_or(address);
        match tokio::time::timeout(etcd::CALL_TIMEOUT, metrics_page(address)).await {
            Ok(Ok(page)) => {
                if let Some(quota) = quota_in(&page) {
                    return Some(quota);
                }
            }
            Ok(Err(err)) => tracing::debug!(endpoint, error = %err, "cannot read etcd's /metrics for its quota"),
            Err(_) => tracing::debug!(endpoint, "etcd's /metrics did not answer in time"),
        }
    }
    None
}

/// The most of a `/metrics` page read: etcd's is about 100 KiB.
const MAX_PAGE: u64 = 4 << 20;

async fn metrics_page(address: &str) -> std::io::Result<String> {
    let mut stream = tokio::net::TcpStream::connect(address).await?;
    let request = format!("GET /metrics HTTP/1.0\r\nHost: {address}\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut page = Vec::new();
    stream.take(MAX_PAGE).read_to_end(&mut page).await?;
    Ok(String::from_utf8_lossy(&page).into_owned())
}

/// The value of `etcd_server_quota_backend_bytes` in a metrics page (`1e+06` or `2147483648`).
fn quota_in(page: &str) -> Option<i64> {
    page.lines().find_map(|line| {
        let value: f64 = line
            .strip_prefix("etcd_server_quota_backend_bytes ")?
            .trim()
            .parse()
            .ok()?;
        (value.is_finite() && value > 0.0 && value < i64::MAX as f64).then_some(value as i64)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_quota_is_read_from_a_metrics_page_and_nonsense_is_not() {
        for (page, quota) in [
            ("# HELP x\netcd_server_quota_backend_bytes 1e+06\n", Some(1_000_000)),
            (
                "etcd_server_quota_backend_bytes 2.147483648e+09\r\n",
                Some(2_147_483_648),
            ),
            ("etcd_server_quota_backend_bytes_other 5\n", None),
            ("etcd_server_quota_backend_bytes NaN\n", None),
            ("etcd_server_quota_backend_bytes -1\n", None),
            ("etcd_server_quota_backend_bytes 1e300\n", None),
            ("", None),
        ] {
            assert_eq!(quota_in(page), quota, "{page:?}");
        }
    }
}
