//! Settling a write whose outcome the leader did not see: a rejection, or a reply lost after
//! the write may have committed. The records read again say, per job, what became of it.

use crate::rules::catch_up::{between, MAX_OWED};
use crate::rules::config::Job;
use crate::rules::record::Claim;

use super::write::Want;

/// A job's last claim as read from etcd, with the revision a claim must find unchanged.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct ReadRecord {
    pub claim: Option<Claim>,
    /// 0 when the job has no record yet (etcd compares a missing key's revision as 0).
    pub mod_revision: i64,
}

/// What a record read after an unsettled write says about it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Resolution {
    /// The write landed.
    Ours,
    /// An earlier attempt of the same claim landed late, after its outcome was taken for
    /// unknown: the record is this leadership's, its ticks are won, and what that attempt
    /// listed as pending (starts made since) is written again by the next claim.
    Earlier,
    /// The record is as it was: nothing landed and nobody else wrote; write again.
    Open,
    /// Another leader wrote the record meanwhile.
    Changed,
}

/// Resolves a write of `intended` over a record at `expected_revision` from the record read
/// after it. Only this leadership writes records with its fence and node: such a record that
/// is not `intended` is an earlier attempt of the same claim.
pub(crate) fn resolve(seen: &ReadRecord, expected_revision: i64, intended: &Claim) -> Resolution {
    if seen.mod_revision == expected_revision {
        return Resolution::Open;
    }
    match &seen.claim {
        Some(claim) if claim == intended => Resolution::Ours,
        Some(claim)
            if claim.term == intended.term
                && claim.node == intended.node
                && claim.scheduled_at >= intended.scheduled_at =>
        {
            Resolution::Earlier
        }
        _ => Resolution::Changed,
    }
}

/// What a leader does with one want after reading its record again.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Reread {
    /// The write landed: etcd holds `record`, and the want's ticks are won. `earlier` when it was
    /// an earlier attempt of the same claim, whose listed starts are to be written again.
    Won {
        want: Want,
        record: Option<Claim>,
        earlier: bool,
    },
    /// Nothing landed and nobody else wrote: write the same again.
    Open(Want),
    /// Another leader wrote the record: write `again` over it, if anything is left to ask.
    /// `taken` counts the new ticks that leader claimed first, which this one does not run.
    Changed { again: Option<Want>, taken: usize },
}

/// Settles `want`, a write of `intended` over the record at `expected_revision` of `job`, by
/// `seen`, the record read after it. `carries_starts`: the write also carried starts of the job.
///
/// After another leader's write, the want keeps asking what is still open: new ticks past the
/// record's last one, and the debts it settles that the record still lists under the same owner,
/// with their adopted ticks. That other leader may be of another shard count and never settles
/// them: dropping them would leave a deposed leader's ticks listed for good, neither run nor
/// recorded. A debt the record no longer lists was settled by someone else. An on-time claim
/// also claims the ticks between the record's last and its own ([`Want::fills_gap`]): a leader of
/// the other shard count may have claimed past them while this one's claim of them was late.
pub(crate) fn after_reread(
    job: &Job,
    mut want: Want,
    seen: &ReadRecord,
    expected_revision: i64,
    intended: Option<Claim>,
    carries_starts: bool,
) -> Reread {
    let resolution = match &intended {
        Some(intended) => resolve(seen, expected_revision, intended),
        None => Resolution::Changed,
    };
    match resolution {
        Resolution::Ours => Reread::Won {
            want,
            record: intended,
            earlier: false,
        },
        Resolution::Earlier => Reread::Won {
            want,
            record: seen.claim.clone(),
            earlier: true,
        },
        Resolution::Open => Reread::Open(want),
        Resolution::Changed => {
            let claimed = want.fresh.len();
            let last = seen.claim.as_ref().map(|claim| claim.scheduled_at);
            want.keep_after(last);
            let taken = claimed - want.fresh.len();
            if let (true, Some(last), Some(first)) = (want.fills_gap, last, want.fresh.first()) {
                let room = MAX_OWED.saturating_sub(want.fresh.len());
                let mut fresh = between(job, last, *first, room);
                fresh.append(&mut want.fresh);
                want.fresh = fresh;
            }
            want.keep_settling(seen.claim.as_ref());
            let again = if want.asks_fresh_or_settles() {
                Some(want)
            } else if carries_starts {
                Some(Want::starts_only(want.index))
            } else {
                None
            };
            Reread::Changed { again, taken }
        }
    }
}
