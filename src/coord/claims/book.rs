//! What a leader knows of its jobs' records, what it asks of them, and the pure rules for the
//! record it writes and for settling a write whose outcome it did not see.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use chrono::{DateTime, Utc};

use crate::coord::ledger::Seen;
use crate::rules::config::Job;
use crate::rules::record::{Claim, Debt};

/// One job of a term and what its leader knows of the job's record.
pub(crate) struct Entry {
    pub(crate) job: Arc<Job>,
    /// The record's mod revision, which the next write must find unchanged; 0 for no record.
    pub(super) revision: i64,
    /// The record as etcd holds it, as far as this leader knows.
    pub(super) record: Option<Claim>,
    /// Whether this leadership has read the record yet: a new leader reads its jobs' records a
    /// transaction's worth at a time as it settles them, so its first claim waits for one read,
    /// not for all of them.
    pub(super) read: bool,
}

impl Entry {
    /// The last tick claimed by anyone, as far as this leader knows.
    pub(crate) fn last(&self) -> Option<DateTime<Utc>> {
        self.record.as_ref().map(|claim| claim.scheduled_at)
    }

    /// The job's record as this leader knows it.
    pub(crate) fn record(&self) -> Option<&Claim> {
        self.record.as_ref()
    }

    /// The record's tick is the job's last claimed one, from which its next-run gauge counts.
    fn publish_claimed(&self) {
        if let Some(tick) = self.last() {
            crate::coord::job_gauges::get().claimed(&self.job.name, tick);
        }
    }

    /// The revision of the job's record as this leader knows it.
    pub(crate) fn revision(&self) -> i64 {
        self.revision
    }
}

/// The jobs of one shard, indexed as the term queues them, with what their leader knows of them.
#[derive(Default)]
pub(crate) struct Book {
    pub(super) entries: Vec<Entry>,
    pub(super) by_name: HashMap<String, usize>,
}

impl std::fmt::Debug for Book {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} jobs remembered", self.entries.len())
    }
}

impl Book {
    /// The book of `jobs`: what `known` (the previous term of this leadership) knew; the
    /// records of the jobs it did not know are read when they are first needed
    /// ([`Claimer::read`](super::Claimer::read)).
    pub(crate) fn open(jobs: Vec<Arc<Job>>, known: Book) -> Book {
        let mut known: HashMap<String, Entry> = known
            .entries
            .into_iter()
            .map(|entry| (entry.job.name.clone(), entry))
            .collect();
        let entries: Vec<Entry> = jobs
            .iter()
            .map(|job| match known.remove(&job.name) {
                Some(entry) => Entry {
                    job: Arc::clone(job),
                    ..entry
                },
                None => Entry {
                    job: Arc::clone(job),
                    revision: 0,
                    record: None,
                    read: false,
                },
            })
            .collect();
        for entry in &entries {
            entry.publish_claimed();
        }
        let by_name = entries
            .iter()
            .enumerate()
            .map(|(index, entry)| (entry.job.name.clone(), index))
            .collect();
        Book { entries, by_name }
    }

    /// This book with every record to be read again when next needed: another election's
    /// leaders may have written them meanwhile.
    pub(crate) fn forgotten(mut self) -> Book {
        for entry in &mut self.entries {
            entry.read = false;
        }
        self
    }

    pub(crate) fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// Where the job named `name` is in the book, if it is this shard's.
    pub(crate) fn index_of(&self, name: &str) -> Option<usize> {
        self.by_name.get(name).copied()
    }

    /// Those of `indices` whose records this leadership has not read yet.
    pub(super) fn unread(&self, indices: impl IntoIterator<Item = usize>) -> Vec<usize> {
        let mut unread: Vec<usize> = indices.into_iter().filter(|index| !self.entries[*index].read).collect();
        unread.sort_unstable();
        unread.dedup();
        unread
    }

    pub(crate) fn job(&self, index: usize) -> &Arc<Job> {
        &self.entries[index].job
    }

    pub(super) fn learn(&mut self, index: usize, seen: &Seen) {
        self.holds(index, seen.mod_revision, seen.claim.clone());
    }

    /// etcd holds `record` at `revision` for the job at `index`.
    pub(super) fn holds(&mut self, index: usize, revision: i64, record: Option<Claim>) {
        let entry = &mut self.entries[index];
        entry.revision = revision;
        entry.record = record;
        entry.read = true;
        entry.publish_claimed();
    }
}

/// What a leader asks of one job's record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Want {
    pub(crate) index: usize,
    /// New ticks to claim, oldest first; those at or before the job's last claimed tick are not
    /// claimed again.
    pub(crate) fresh: Vec<DateTime<Utc>>,
    /// Pending ticks of an earlier leader that this one delivers again.
    pub(crate) adopt: Vec<DateTime<Utc>>,
    /// The earlier leaders whose pending ticks this write settles (each adopted or recorded
    /// lost), so the record stops listing them.
    pub(crate) settles: Vec<Owner>,
    /// Only writes the starts of ticks this leader owed.
    pub(super) starts_only: bool,
}

impl Want {
    /// Claims one new tick.
    pub(crate) fn tick(index: usize, tick: DateTime<Utc>) -> Want {
        Want {
            index,
            fresh: vec![tick],
            adopt: Vec::new(),
            settles: Vec::new(),
            starts_only: false,
        }
    }

    /// What a new leader claims for a job: missed ticks, and the pending ticks of the earlier
    /// leaders it `settles` that it delivers again (`adopt`); it records the others lost.
    pub(crate) fn catch_up(
        index: usize,
        fresh: Vec<DateTime<Utc>>,
        adopt: Vec<DateTime<Utc>>,
        settles: Vec<Owner>,
    ) -> Want {
        Want {
            index,
            fresh,
            adopt,
            settles,
            starts_only: false,
        }
    }

    /// Whether this write asks anything of the record.
    pub(super) fn asks_anything(&self) -> bool {
        !self.fresh.is_empty() || !self.adopt.is_empty() || !self.settles.is_empty() || self.starts_only
    }

    fn settles_debt(&self, debt: &Debt) -> bool {
        self.settles.iter().any(|owner| debt.owed_by(owner.term, &owner.node))
    }

    /// Drops the new ticks at or before `last`, the job's last claimed tick: never claimed twice.
    pub(super) fn keep_after(&mut self, last: Option<DateTime<Utc>>) {
        self.fresh.retain(|tick| last.is_none_or(|last| last < *tick));
    }

    pub(crate) fn starts_only(index: usize) -> Want {
        Want {
            index,
            fresh: Vec::new(),
            adopt: Vec::new(),
            settles: Vec::new(),
            starts_only: true,
        }
    }
}

/// A leader that owes pending ticks: its term and node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Owner {
    pub(crate) term: i64,
    pub(crate) node: String,
}

impl Owner {
    pub(crate) fn of(debt: &Debt) -> Owner {
        Owner {
            term: debt.term,
            node: debt.node.clone(),
        }
    }
}

/// A job's ticks that a claim won: this leader owes them now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Won {
    pub(crate) index: usize,
    pub(crate) fresh: Vec<DateTime<Utc>>,
    pub(crate) adopt: Vec<DateTime<Utc>>,
    /// The revision of the write that won them: the runs' `CRON_FENCE`. etcd's revision only
    /// grows, so a job's fence grows from one claim to the next whichever leader, election or
    /// shard count made it.
    pub(crate) fence: i64,
}

/// What a record read after an unsettled write says about it.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Resolution {
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
pub(super) fn resolve(seen: &Seen, expected_revision: i64, intended: &Claim) -> Resolution {
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

/// The record a leader with `fence` on `node` writes for `want` over `current`, owing `owed`,
/// for a job now on `schedule` (its [`label`](crate::rules::schedule::Schedule::label)).
///
/// The pending list is what the leader owes after the write: ticks owed from earlier claims,
/// the new ones and the adopted ones. Every other leader's pending ticks stay listed under its
/// own name unless this write settles them, so no write ever drops a tick someone still owes,
/// nor takes for its own a tick that leader may still start. `None` when there is nothing to
/// write: no record and no tick.
pub(super) fn next_record(
    current: Option<&Claim>,
    want: &Want,
    owed: &BTreeSet<DateTime<Utc>>,
    writer: &Writer,
    schedule: &str,
) -> Option<Claim> {
    let Writer {
        term,
        node,
        shards,
        releasing,
    } = *writer;
    let mut pending = owed.clone();
    pending.extend(want.fresh.iter().chain(&want.adopt).copied());
    let mut others: Vec<Debt> = Vec::new();
    // The writer's own debt is what it owes now, not what it wrote before.
    let kept = current
        .into_iter()
        .flat_map(Claim::debts)
        .filter(|debt| !debt.owed_by(term, node) && !want.settles_debt(debt));
    for debt in kept {
        match others.iter_mut().find(|other| other.owed_by(debt.term, &debt.node)) {
            Some(other) => {
                other.pending.extend(debt.pending);
                other.pending.sort_unstable();
                other.pending.dedup();
            }
            None => others.push(debt),
        }
    }
    let pending_is_empty = pending.is_empty();
    let newest = want.fresh.iter().max().copied();
    let last = current.map(|claim| claim.scheduled_at);
    let scheduled_at = match (last, newest) {
        (Some(last), Some(newest)) => last.max(newest),
        (last, newest) => last.or(newest)?,
    };
    // The schedule names the one that made `scheduled_at` a tick: a write that does not move it
    // keeps the name it had.
    let schedule = if last == Some(scheduled_at) {
        current.and_then(|claim| claim.schedule.clone())
    } else {
        Some(schedule.to_string())
    };
    Some(Claim {
        scheduled_at,
        term,
        node: node.to_string(),
        shards: (!pending_is_empty).then_some(shards),
        pending: pending.into_iter().collect(),
        schedule,
        others,
        released: releasing && !pending_is_empty,
    })
}

/// Who writes a record: a leader's term, node and election, and whether its leadership has
/// ended with every spawn settled, so what it still lists will never start.
pub(super) struct Writer<'a> {
    pub(super) term: i64,
    pub(super) node: &'a str,
    pub(super) shards: u32,
    pub(super) releasing: bool,
}

#[cfg(test)]
mod tests;
