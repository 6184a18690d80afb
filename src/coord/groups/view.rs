//! What the node's mirror shows of every group: who holds each slot and who waits in line, on
//! which lease.

use std::collections::{BTreeMap, HashMap};

use etcd_client::Client;

use crate::coord::etcd::{self, CoordError};
use crate::coord::keys::{GroupKey, Keys};
use crate::coord::mirror::Put;
use crate::rules::groups::{Holder, Place};

/// The slots held and the attempts in line of every group, as the node's mirror shows them.
#[derive(Debug, Clone, Default)]
pub(crate) struct GroupView {
    pub(crate) slots: BTreeMap<u32, Kept>,
    pub(crate) waiting: BTreeMap<Place, Kept>,
}

/// A slot's or a place's value, and the lease it lives on.
#[derive(Debug, Clone)]
pub(crate) struct Kept {
    pub(crate) holder: Holder,
    pub(crate) lease: i64,
}

impl GroupView {
    /// Who holds the slots, for a log line: `job@node` each, at most `max` of them.
    pub(crate) fn holders(&self, max: usize) -> String {
        let mut named: Vec<String> = self
            .slots
            .values()
            .take(max)
            .map(|kept| format!("{}@{}", kept.holder.job, kept.holder.node))
            .collect();
        if self.slots.len() > max {
            named.push(format!("and {} more", self.slots.len() - max));
        }
        named.join(", ")
    }
}

/// Puts a key under [`Keys::groups_prefix`] that was put (`Some`) or deleted into `views`.
pub(super) fn apply_to(views: &mut HashMap<String, GroupView>, keys: &Keys, key: &[u8], put: Option<Put>) {
    let Some((group, what)) = std::str::from_utf8(key).ok().and_then(|key| keys.parse_group_key(key)) else {
        return;
    };
    let kept = put.and_then(|put| {
        let holder = serde_json::from_slice::<Holder>(put.value).ok()?;
        Some(Kept {
            holder,
            lease: put.lease,
        })
    });
    let view = views.entry(group.to_string()).or_default();
    match (what, kept) {
        (GroupKey::Slot(slot), Some(kept)) => {
            view.slots.insert(slot, kept);
        }
        (GroupKey::Slot(slot), None) => {
            view.slots.remove(&slot);
        }
        (GroupKey::Waiting(segment), kept) => {
            if let Some(place) = Place::parse(segment) {
                match kept {
                    Some(kept) => view.waiting.insert(place, kept),
                    None => view.waiting.remove(&place),
                };
            }
        }
    }
    if view.slots.is_empty() && view.waiting.is_empty() {
        views.remove(group);
    }
}

/// Every group's slots and line as etcd holds them now, for `status`.
pub(crate) async fn read_views(client: &Client, keys: &Keys) -> Result<HashMap<String, GroupView>, CoordError> {
    let (read, _) = etcd::read_prefix(client, &keys.groups_prefix()).await?;
    let mut views = HashMap::new();
    for kv in &read {
        let put = Put {
            value: kv.value(),
            lease: kv.lease(),
        };
        apply_to(&mut views, keys, kv.key(), Some(put));
    }
    Ok(views)
}
