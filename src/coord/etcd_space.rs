//! etcd's space: its history compacted by one node of the fleet, and its database size, quota
//! and NOSPACE alarm followed by every node.
//!
//! etcd keeps every revision of every key until someone compacts its history. Claims, results
//! and elections write several revisions a second, so an etcd nobody compacts grows until its
//! quota raises the NOSPACE alarm, and from then on refuses every write: no claim, no lease.
//! Kubernetes' API server compacts its etcd itself; a dedicated etcd does so only if its
//! operator set `--auto-compaction-retention`. So the node that leads shard 0 compacts, every
//! `[etcd] compaction`, to the revision seen one interval earlier (marked in etcd, so a change
//! of leader does not start the interval over): the history etcd keeps is always at least that long, far longer than any watch of ours needs between its read and its
//! start (and a watch that still finds its revision compacted reads its prefix again).

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use etcd_client::Client;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::backoff::sleep_or_cancel;
use crate::coord::etcd::{self, CoordError};
use crate::coord::keys::Keys;
use crate::coord::session::Session;
use crate::coord::view::FleetView;
use crate::readiness::Readiness;

/// The shard whose leader compacts: one node at a time, and another within a TTL of its death.
const COMPACTING_SHARD: u32 = 0;

/// Where the compacting node keeps the revision it saw, and when: the mark outlives a change of
/// leader, so a fleet whose shard 0 changes hands more often than every interval (a fault a
/// minute) still compacts; a mark kept in memory started over at each change and never did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct Mark {
    revision: i64,
    at: DateTime<Utc>,
}

/// What to do with etcd's history at `now`, at revision `revision`, given the `mark` read.
#[derive(Debug, PartialEq, Eq)]
enum Step {
    /// Nothing yet: the mark is younger than the interval.
    Wait,
    /// Compact to this revision (if older than now), then mark now.
    CompactTo(i64),
    /// No usable mark: mark now.
    Mark,
}

fn step(mark: Option<Mark>, revision: i64, now: DateTime<Utc>, every: chrono::Duration) -> Step {
    match mark {
        // A mark from a clock far ahead is no mark: it would hold compaction off for as long.
        Some(mark) if mark.at > now + every => Step::Mark,
        Some(mark) if now - mark.at >= every => Step::CompactTo(mark.revision.min(revision)),
        Some(_) => Step::Wait,
        None => Step::Mark,
    }
}

/// Compacts etcd's history while this node leads shard 0: every `every`, to the revision seen
/// `every` before, as marked in etcd by whichever node led shard 0 then. Ends with the session.
pub(crate) async fn compact(
    session: Session,
    keys: Keys,
    node_id: String,
    every: Duration,
    view: watch::Receiver<FleetView>,
) {
    // Looked at a few times an interval, so a new leader of shard 0 goes on soon.
    let look_every = (every / 5).clamp(Duration::from_secs(1), Duration::from_secs(60));
    let every_chrono = chrono::Duration::from_std(every).unwrap_or(chrono::Duration::MAX);
    loop {
        let leads = view
            .borrow()
            .leaders
            .get(COMPACTING_SHARD as usize)
            .and_then(Option::as_ref)
            .is_some_and(|(leader, _)| *leader == node_id);
        if leads {
            if let Err(err) = compact_once(&session.client(), &keys.compaction_mark(), every_chrono).await {
                tracing::debug!(error = %err, "cannot compact etcd's history now; trying again later");
            }
        }
        if !sleep_or_cancel(look_every, session.ended()).await {
            return;
        }
    }
}

async fn compact_once(client: &Client, key: &str, every: chrono::Duration) -> Result<(), CoordError> {
    let revision = revision_now(client).await?;
    let read = etcd::call(client.clone().get(key, None)).await?;
    // An unreadable mark is no mark: it is written over.
    let mark = read
        .kvs()
        .first()
        .and_then(|kv| serde_json::from_slice::<Mark>(kv.value()).ok());
    let now = Utc::now();
    match step(mark, revision, now, every) {
        Step::Wait => return Ok(()),
        Step::CompactTo(old) if old < revision => compact_to(client, old).await,
        Step::CompactTo(_) | Step::Mark => {}
    }
    let value = serde_json::to_vec(&Mark { revision, at: now }).map_err(|err| CoordError::Protocol(err.to_string()))?;
    etcd::call(client.clone().put(key, value, None)).await?;
    Ok(())
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
    fn the_previous_releases_compaction_mark_is_read() {
        let (_, value) = crate::coord::record_format::previous_release_records()
            .into_iter()
            .find(|(path, _)| path == "compaction")
            .expect("the fixture has the mark");
        let mark: Mark = serde_json::from_str(&value).expect("the mark parses");
        assert!(mark.revision > 0, "{mark:?}");
    }

    #[test]
    fn the_history_is_compacted_an_interval_after_the_mark_whoever_marked_it() {
        let at = |second: i64| DateTime::<Utc>::from_timestamp(1_800_000_000 + second, 0).unwrap();
        let every = chrono::Duration::seconds(300);
        let mark = |revision: i64, second: i64| {
            Some(Mark {
                revision,
                at: at(second),
            })
        };
        let cases = [
            (None, Step::Mark, "no mark yet"),
            (mark(50, 0), Step::Wait, "younger than the interval"),
            (
                mark(50, -300),
                Step::CompactTo(50),
                "an interval old, whichever node wrote it",
            ),
            (mark(500, -400), Step::CompactTo(100), "never past the revision now"),
            (mark(50, 100), Step::Wait, "a little ahead: waits"),
            (mark(50, 400), Step::Mark, "far ahead of this clock: written over"),
        ];
        for (mark, expected, why) in cases {
            assert_eq!(step(mark, 100, at(0), every), expected, "{why}");
        }
    }

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
