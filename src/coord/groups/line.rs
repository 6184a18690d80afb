//! An attempt's place in its group's line: put, taken out, and left when the attempt gives up.

use std::sync::Arc;

use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp};

use super::{Groups, RETRY};
use crate::coord::etcd::{self, CoordError};
use crate::coord::keys::GroupKey;
use crate::coord::session::Session;
use crate::rules::groups::Group;

impl Groups {
    /// Puts the attempt's place, `key`, in its group's line.
    pub(super) async fn stand_in_line(&self, key: &str, value: &[u8], lease: &Session) -> Result<(), CoordError> {
        let options = PutOptions::new().with_lease(lease.lease());
        etcd::call(self.client.clone().put(key, value.to_vec(), Some(options))).await?;
        Ok(())
    }

    /// Takes the place `key` holding `value` out of the line, trying until etcd answers or the
    /// lease it is on ends (and the place with it): the lease lives as long as the node, so a
    /// place left would be handed a slot nobody runs. `Some(true)` if it was in line.
    pub(super) async fn remove_place(&self, group: &str, key: &str, value: &[u8], lease: &Session) -> Option<bool> {
        let txn = Txn::new()
            .when([Compare::value(key, CompareOp::Equal, value.to_vec())])
            .and_then([TxnOp::delete(key, None)]);
        while lease.is_live() {
            match etcd::call(self.client.clone().txn(txn.clone())).await {
                Ok(response) => return Some(response.succeeded()),
                Err(err) => {
                    tracing::debug!(error = %err, group, "cannot take a place out of the group's line yet; trying again");
                    tokio::time::sleep(RETRY).await;
                }
            }
        }
        None
    }

    /// An attempt that gives up takes its place out of the line, if it may have put one, and
    /// gives back a slot handed to it meanwhile, or taken by a write whose reply was lost
    /// (`unsure`). Each step is tried until etcd answers or the lease ends; anything left
    /// after that is the sweep's.
    pub(super) async fn leave_line(
        self: &Arc<Self>,
        group: &Group,
        value: &[u8],
        key: &str,
        placed: Option<&Session>,
        unsure: Option<u32>,
        lease: &Session,
    ) {
        let was_in_line = match placed {
            Some(on) => self.remove_place(&group.name, key, value, on).await,
            None => Some(false),
        };
        // Gone from the line without this node taking it out: a slot may have been handed to it.
        let look = match was_in_line {
            Some(true) => unsure.is_some(),
            Some(false) => placed.is_some() || unsure.is_some(),
            None => false,
        };
        if !look {
            return;
        }
        let prefix = self.keys.group_slots_prefix(&group.name);
        let read = loop {
            if !lease.is_live() {
                return;
            }
            match etcd::call(
                self.client
                    .clone()
                    .get(prefix.as_str(), Some(GetOptions::new().with_prefix())),
            )
            .await
            {
                Ok(read) => break read,
                Err(err) => {
                    tracing::debug!(error = %err, group = %group.name, "cannot read the group's slots yet; trying again");
                    tokio::time::sleep(RETRY).await;
                }
            }
        };
        for kv in read.kvs() {
            if kv.value() != value || kv.lease() != lease.lease() {
                continue;
            }
            let slot = std::str::from_utf8(kv.key())
                .ok()
                .and_then(|key| self.keys.parse_group_key(key))
                .and_then(|(_, what)| match what {
                    GroupKey::Slot(slot) => Some(slot),
                    GroupKey::Waiting(_) => None,
                });
            if let Some(slot) = slot {
                self.slot(&group.name, group.limit, slot, value.to_vec(), lease, None)
                    .release()
                    .await;
            }
        }
    }
}
