//! A slot an attempt holds, and its release: handed to the first in line, or freed.

use std::sync::Arc;

use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp};
use tokio_util::sync::CancellationToken;

use super::attending::Attending;
use super::{Groups, RETRY};
use crate::coord::etcd::{self, CoordError};
use crate::coord::session::Session;
use crate::rules::groups::within;

impl Groups {
    pub(super) fn slot(
        self: &Arc<Self>,
        group: &str,
        limit: u32,
        slot: u32,
        value: Vec<u8>,
        lease: &Session,
        attending: Option<Attending>,
    ) -> Slot {
        Slot {
            held: Some(Held {
                groups: Arc::clone(self),
                group: group.to_string(),
                limit,
                slot,
                value,
                lease: lease.clone(),
                _attending: attending,
            }),
        }
    }
}

/// A slot held by one attempt. Released when the attempt's process group has ended; dropped
/// unreleased (a run cancelled from outside), it is released by a task of its own.
pub(crate) struct Slot {
    held: Option<Held>,
}

struct Held {
    groups: Arc<Groups>,
    group: String,
    /// The group's limit when the slot was taken: the one its release goes by if the config no
    /// longer has the group.
    limit: u32,
    slot: u32,
    /// The slot key's value as this attempt holds it: a release changes the key only while it
    /// still holds this, so a slot that lapsed and went to another attempt is left alone.
    value: Vec<u8>,
    lease: Session,
    /// The attempt holding the slot, known to the sweep until the release has ended.
    _attending: Option<Attending>,
}

impl Slot {
    /// Cancelled when the lease the slot lives on is lost: the attempt must stop, since the
    /// slot may be another's by now.
    pub(crate) fn lapsed(&self) -> CancellationToken {
        self.held
            .as_ref()
            .map_or_else(CancellationToken::new, |held| held.lease.ended().clone())
    }

    /// Hands the slot to the first attempt in line, or frees it if none waits.
    pub(crate) async fn release(mut self) {
        if let Some(held) = self.held.take() {
            held.release().await;
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(held) = self.held.take() {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(held.release());
            }
        }
    }
}

impl Held {
    async fn release(self) {
        let groups = &self.groups;
        let key = groups.keys.group_slot(&self.group, self.slot);
        let mine = || Compare::value(key.as_str(), CompareOp::Equal, self.value.clone());
        // While the lease holds: once it is gone, so is the slot.
        while self.lease.is_live() {
            match self.hand_on(&key, mine()).await {
                Ok(true) => return,
                Ok(false) => continue,
                Err(err) => {
                    tracing::debug!(error = %err, group = %self.group, slot = self.slot, "cannot free the group slot yet; trying again");
                    tokio::time::sleep(RETRY).await;
                }
            }
        }
    }

    /// One try: hands the slot to the first in line, or frees it (also a slot past the group's
    /// limit now, lowered since it was taken). `false` when the first in line left before the
    /// hand-over: the next try looks again.
    async fn hand_on(&self, key: &str, mine: Compare) -> Result<bool, CoordError> {
        let groups = &self.groups;
        let free = || Txn::new().when([mine.clone()]).and_then([TxnOp::delete(key, None)]);
        let limit = groups.limit_of(&self.group, self.limit);
        if !within(self.slot, limit) {
            etcd::call(groups.client.clone().txn(free())).await?;
            tracing::debug!(group = %self.group, slot = self.slot, "freed a group slot past the group's limit");
            return Ok(true);
        }
        // Slots past a lowered limit still held count against the free ones below it: handed on,
        // this one would start a run beside them past the limit. Freed, the first in line takes
        // it once they have ended.
        if groups.held_past(&self.group, limit) > 0 {
            etcd::call(groups.client.clone().txn(free())).await?;
            tracing::debug!(group = %self.group, slot = self.slot, "freed a group slot instead of handing it on: slots past the group's lowered limit are still held");
            return Ok(true);
        }
        let first = GetOptions::new().with_prefix().with_limit(1);
        let line = groups.keys.group_waiting_prefix(&self.group);
        let read = etcd::call(groups.client.clone().get(line, Some(first))).await?;
        let Some(heir) = read.kvs().first() else {
            etcd::call(groups.client.clone().txn(free())).await?;
            return Ok(true);
        };
        let handed = Txn::new()
            .when([mine.clone(), Compare::version(heir.key(), CompareOp::Greater, 0)])
            .and_then([
                TxnOp::put(key, heir.value(), Some(PutOptions::new().with_lease(heir.lease()))),
                TxnOp::delete(heir.key(), None),
            ]);
        if etcd::call(groups.client.clone().txn(handed)).await?.succeeded() {
            tracing::debug!(group = %self.group, slot = self.slot, heir = %String::from_utf8_lossy(heir.key()), "handed the group slot to the first in line");
            return Ok(true);
        }
        // Either the slot is no longer this attempt's (its lease lapsed) or the heir left.
        let still = etcd::call(groups.client.clone().get(key, None)).await?;
        let held = still
            .kvs()
            .first()
            .is_some_and(|kv| kv.value() == self.value.as_slice());
        Ok(!held)
    }
}
