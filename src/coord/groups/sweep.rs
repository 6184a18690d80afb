//! The node's sweep of its own slot lease: a place in a group's line that no attempt of this
//! process waits at, or a slot that none of them holds or waits for, is ended. A reply lost at
//! the wrong moment, or an attempt dropped while it waited, leaves one; the lease lives as long
//! as the node, so nothing else would end it.

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Compare, CompareOp, Txn, TxnOp};
use tokio_util::sync::CancellationToken;

use super::{Groups, Phase};
use crate::coord::etcd::{self, CoordError};
use crate::coord::session::Session;
use crate::rules::groups::Holder;

/// How often the node looks on its lease for places and slots no attempt of it accounts for.
const SWEEP: Duration = Duration::from_secs(3);

/// Something on the node's lease the sweep looks at.
#[derive(Debug, Clone)]
enum Left {
    Slot(u32),
    Place(String),
}

impl Groups {
    /// Every few seconds until `cancel`: takes out of the lines the places on the node's lease
    /// that no attempt of this process waits at, and frees (or hands on) the slots on it that no
    /// attempt of this process holds. Those are left by a reply lost at the wrong moment, or an
    /// attempt dropped while it waited; the lease lives as long as the node, so nothing else
    /// would end them. Looks only at the mirror until it finds one.
    pub(crate) async fn sweep(self: Arc<Self>, cancel: CancellationToken) {
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(SWEEP) => {}
            }
            let Some(lease) = self.lease_if_live() else { continue };
            for (group, left) in self.left_behind(lease.lease()) {
                if let Err(err) = self.clean(&group, left, &lease).await {
                    tracing::debug!(error = %err, group = %group, "cannot clean up the group yet; trying at the next sweep");
                }
            }
        }
    }

    /// What on `lease` the mirror shows and no attempt of this process accounts for.
    fn left_behind(&self, lease: i64) -> Vec<(String, Left)> {
        let attending = self.attending().clone();
        let views = self.lock();
        let mut left = Vec::new();
        for (group, view) in views.iter() {
            for (slot, kept) in &view.slots {
                let held = attending.get(&kept.holder) == Some(&Phase::Holding(*slot));
                let handed = attending.get(&kept.holder) == Some(&Phase::Waiting);
                if kept.lease == lease && !held && !handed {
                    left.push((group.clone(), Left::Slot(*slot)));
                }
            }
            for (place, kept) in &view.waiting {
                if kept.lease == lease && attending.get(&kept.holder) != Some(&Phase::Waiting) {
                    left.push((group.clone(), Left::Place(place.segment())));
                }
            }
        }
        left
    }

    /// Reads what the sweep found from etcd and, if it is still on `lease` and still no
    /// attempt's, ends it. The attempt is looked up after the read: an attempt says it waits
    /// before it puts a place, so a place put since makes the guarded delete fail.
    async fn clean(self: &Arc<Self>, group: &str, left: Left, lease: &Session) -> Result<(), CoordError> {
        let key = match &left {
            Left::Slot(slot) => self.keys.group_slot(group, *slot),
            Left::Place(segment) => self.keys.group_waiting(group, segment),
        };
        let read = etcd::call(self.client.clone().get(key.as_str(), None)).await?;
        let Some(kv) = read.kvs().first() else {
            return Ok(());
        };
        let Ok(holder) = serde_json::from_slice::<Holder>(kv.value()) else {
            return Ok(());
        };
        if kv.lease() != lease.lease() {
            return Ok(());
        }
        let phase = self.attending().get(&holder).copied();
        match left {
            Left::Place(_) if phase == Some(Phase::Waiting) => {}
            Left::Place(_) => {
                let txn = Txn::new()
                    .when([Compare::mod_revision(key.as_str(), CompareOp::Equal, kv.mod_revision())])
                    .and_then([TxnOp::delete(key.as_str(), None)]);
                if etcd::call(self.client.clone().txn(txn)).await?.succeeded() {
                    tracing::warn!(group, job = %holder.job, tick = %crate::clock::rfc3339(holder.tick), "took out of the group's line a place no attempt of this node waits at (a reply lost at the wrong moment)");
                }
            }
            Left::Slot(slot) if phase == Some(Phase::Holding(slot)) || phase == Some(Phase::Waiting) => {}
            Left::Slot(slot) => {
                tracing::warn!(group, slot, job = %holder.job, tick = %crate::clock::rfc3339(holder.tick), "freeing a group slot no attempt of this node holds (a reply lost at the wrong moment)");
                // A group the config no longer has: freed, since no job of it runs.
                self.slot(group, 0, slot, kv.value().to_vec(), lease, None)
                    .release()
                    .await;
            }
        }
        Ok(())
    }
}
