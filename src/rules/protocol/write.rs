//! The record a leader writes: what it asks of a job's record ([`Want`]), and the record that
//! follows from it, listing what the writer owes and keeping what every other leader owes.

use std::collections::BTreeSet;

use chrono::{DateTime, Utc};

use crate::rules::record::{Claim, Debt, Going};

/// What a leader asks of one job's record.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
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
    pub(crate) starts_only: bool,
    /// An on-time claim of a job its leader fires: every tick between the record's last and the
    /// new ones is its to claim too, should another leader's write move the record less far.
    pub(crate) fills_gap: bool,
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
            fills_gap: true,
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
            fills_gap: false,
        }
    }

    /// Whether this write asks anything of the record.
    pub(crate) fn asks_anything(&self) -> bool {
        !self.fresh.is_empty() || !self.adopt.is_empty() || !self.settles.is_empty() || self.starts_only
    }

    fn settles_debt(&self, debt: &Debt) -> bool {
        self.settles.iter().any(|owner| debt.owed_by(owner.term, &owner.node))
    }

    /// Drops the new ticks at or before `last`, the job's last claimed tick: never claimed twice.
    pub(crate) fn keep_after(&mut self, last: Option<DateTime<Utc>>) {
        self.fresh.retain(|tick| last.is_none_or(|last| last < *tick));
    }

    /// After another leader wrote the record as `current`: keeps settling only the debts it
    /// still lists under their owners, and adopting only ticks those debts still list.
    pub(crate) fn keep_settling(&mut self, current: Option<&Claim>) {
        let listed: Vec<Debt> = current.into_iter().flat_map(Claim::debts).collect();
        self.settles
            .retain(|owner| listed.iter().any(|debt| debt.owed_by(owner.term, &owner.node)));
        let still_owed: BTreeSet<DateTime<Utc>> = listed
            .iter()
            .filter(|debt| self.settles_debt(debt))
            .flat_map(|debt| debt.pending.iter().copied())
            .collect();
        self.adopt.retain(|tick| still_owed.contains(tick));
    }

    /// Whether it claims new ticks or settles an earlier leader's: more than writing starts.
    pub(crate) fn asks_fresh_or_settles(&self) -> bool {
        !self.fresh.is_empty() || !self.settles.is_empty()
    }

    pub(crate) fn starts_only(index: usize) -> Want {
        Want {
            index,
            fresh: Vec::new(),
            adopt: Vec::new(),
            settles: Vec::new(),
            starts_only: true,
            fills_gap: false,
        }
    }
}

/// A leader that owes pending ticks: its term and node.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
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
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Won {
    pub(crate) index: usize,
    pub(crate) fresh: Vec<DateTime<Utc>>,
    pub(crate) adopt: Vec<DateTime<Utc>>,
    /// The earlier leaders whose debts the write settled: the ticks of theirs it did not adopt
    /// are to be recorded lost.
    pub(crate) settles: Vec<Owner>,
    /// The revision of the write that won them: the runs' `CRON_FENCE`. etcd's revision only
    /// grows, so a job's fence grows from one claim to the next whichever leader, election or
    /// shard count made it.
    pub(crate) fence: i64,
}

/// The record a leader with `fence` on `node` writes for `want` over `current`, owing `owed`,
/// for a job now on `schedule` (its [`label`](crate::rules::schedule::Schedule::label)).
///
/// The pending list is what the leader owes after the write: ticks owed from earlier claims,
/// the new ones and the adopted ones. Every other leader's pending ticks stay listed under its
/// own name unless this write settles them, so no write ever drops a tick someone still owes,
/// nor takes for its own a tick that leader may still start. `None` when there is nothing to
/// write: no record and no tick.
pub(crate) fn next_record(
    current: Option<&Claim>,
    want: &Want,
    owed: &BTreeSet<DateTime<Utc>>,
    writer: &Writer,
    schedule: &str,
) -> Option<Claim> {
    let Writer {
        term,
        node,
        pool,
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
        pool: pool.filter(|_| !pending_is_empty).map(str::to_string),
        pending: pending.into_iter().collect(),
        schedule,
        others,
        released: releasing && !pending_is_empty,
        going: going_after(current, None, node, |_| false),
    })
}

/// At most this many runs of one job a record lists as going: one per node that ran the job
/// beside another, which a takeover or two make; more would be leftovers of nodes long gone.
pub(crate) const MAX_GOING: usize = 8;

/// The runs of a job going on that a record written by `writer` lists: its own runs `own` (a
/// node may run several at once: a backfill's `--parallel`), and the other nodes' that
/// `current` lists and the writer has not seen end (`seen_ended`). A writer's own
/// runs it knows itself: what `current` says of them is old.
pub(crate) fn going_after(
    current: Option<&Claim>,
    own: impl IntoIterator<Item = Going>,
    writer: &str,
    seen_ended: impl Fn(&Going) -> bool,
) -> Vec<Going> {
    let mut going: Vec<Going> = current
        .into_iter()
        .flat_map(|claim| &claim.going)
        .filter(|run| run.node != writer && !seen_ended(run))
        .cloned()
        .collect();
    going.extend(own);
    going.sort_by_key(|run| std::cmp::Reverse(run.fence));
    going.truncate(MAX_GOING);
    going
}

/// Who writes a record: a leader's term, node and election, and whether its leadership has
/// ended with every spawn settled, so what it still lists will never start.
pub(crate) struct Writer<'a> {
    pub(crate) term: i64,
    pub(crate) node: &'a str,
    /// The pool of its election; `None` for the fleet's.
    pub(crate) pool: Option<&'a str>,
    pub(crate) shards: u32,
    pub(crate) releasing: bool,
}
