//! A backfill tick after its run: counted done or given back by the node that ran it; and the
//! ticks in flight that no node will ever count, settled by the job's delivery.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::record::update;
use crate::coord::etcd::CoordError;
use crate::coord::keys::Keys;
use crate::rules::backfill::InFlight;
use crate::rules::config::Delivery;

/// How long a node keeps trying to count a tick it ran before leaving it to the orphan rule.
const SETTLE_FOR: Duration = Duration::from_secs(60);

/// What becomes of a backfill tick a node claimed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Settle {
    /// Its run ended and was recorded.
    Done,
    /// It did not start: claimed again later.
    Again,
}

/// Counts `tick`, claimed as `claim` for backfill `id`, done or gives it back; retried for
/// [`SETTLE_FOR`], after which the tick is left in flight for the orphan rule.
pub(crate) async fn settle_tick(
    client: &etcd_client::Client,
    keys: &Keys,
    job: &str,
    id: &str,
    tick: DateTime<Utc>,
    claim: &str,
    settle: Settle,
) -> bool {
    let deadline = tokio::time::Instant::now() + SETTLE_FOR;
    let mut backoff = crate::backoff::Backoff::coordination();
    loop {
        let written = update(client, keys, job, Some(id), |backfill| match settle {
            Settle::Done => backfill.finish(tick, claim),
            Settle::Again => backfill.give_back(tick, claim, false),
        })
        .await;
        match written {
            Ok(_) => return true,
            Err(err) if tokio::time::Instant::now() >= deadline => {
                tracing::warn!(error = %err, "could not count a backfill tick; its node's next start or the shard's leader gives it back");
                return false;
            }
            Err(err) => {
                tracing::debug!(error = %err, "counting a backfill tick; trying again");
                tokio::time::sleep(backoff.next_delay()).await;
            }
        }
    }
}

/// Settles the ticks of `job`'s backfill in flight that `orphaned` says their nodes will never
/// count: given back flagged as redelivered for an at-least-once job, recorded lost for an
/// at-most-once one. Returns how many.
pub(crate) async fn settle_orphans(
    client: &etcd_client::Client,
    keys: &Keys,
    job: &str,
    delivery: Delivery,
    orphaned: impl Fn(&InFlight) -> bool,
) -> Result<usize, CoordError> {
    let settled = std::sync::atomic::AtomicUsize::new(0);
    let written = update(client, keys, job, None, |backfill| {
        let orphans = backfill.orphans(&orphaned);
        for orphan in &orphans {
            match delivery {
                Delivery::AtLeastOnce => backfill.give_back(orphan.tick, &orphan.claim, true),
                Delivery::AtMostOnce => backfill.record_lost(orphan.tick, &orphan.claim),
            };
        }
        settled.store(orphans.len(), std::sync::atomic::Ordering::Relaxed);
        !orphans.is_empty()
    })
    .await?;
    if written.is_none() {
        return Ok(0);
    }
    let next = match delivery {
        Delivery::AtLeastOnce => "run again, flagged redelivered",
        Delivery::AtMostOnce => "recorded lost",
    };
    tracing::warn!(
        job,
        ticks = settled.load(std::sync::atomic::Ordering::Relaxed),
        next,
        "backfill ticks were in flight on a node that went, or on an earlier run of this one"
    );
    Ok(settled.into_inner())
}
