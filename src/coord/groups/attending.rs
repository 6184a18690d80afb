//! Which attempts of this process the groups know of, and where each stands: the sweep leaves
//! alone what they account for.

use std::sync::Arc;

use super::Groups;
use crate::rules::groups::Holder;

/// Where an attempt of this process stands in its group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    /// Looking for a slot: it may have a place in line, and a slot may be handed to it.
    Waiting,
    /// Holding this slot, until its release has ended.
    Holding(u32),
}

/// An attempt known to the node's groups from before its first write to after its last: the
/// sweep leaves alone what it accounts for, and cleans up what it left once it is gone.
pub(super) struct Attending {
    groups: Arc<Groups>,
    holder: Holder,
}

impl Attending {
    pub(super) fn set(&self, phase: Phase) {
        self.groups.attending().insert(self.holder.clone(), phase);
    }
}

impl Drop for Attending {
    fn drop(&mut self) {
        self.groups.attending().remove(&self.holder);
    }
}

impl Groups {
    pub(super) fn attend(self: &Arc<Self>, holder: &Holder) -> Attending {
        let attending = Attending {
            groups: Arc::clone(self),
            holder: holder.clone(),
        };
        attending.set(Phase::Waiting);
        attending
    }
}
