//! How a run came to this node, and everything that differs by it, answered here once (the
//! table in docs/how-it-works.md, "Every kind of run"): the rest of the code asks, never
//! branches on the kind. A new kind of run is a variant here, its answers below, and the line
//! of the leader that claims it.

use chrono::{DateTime, Utc};

use crate::rules::record::Trigger;

/// How a run came to this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Arrival {
    /// A tick of the schedule, claimed just before it was due.
    Scheduled,
    /// A tick of the schedule missed while its shard had no leader, run late by a new one.
    CaughtUp,
    /// A tick of the schedule an earlier leader claimed and may have started: run again,
    /// flagged `CRON_REDELIVERED`, as a late run even when it is due only now.
    Redelivered,
    /// `shardcron trigger`: the id of the request the run answers.
    Manual(String),
    /// `shardcron backfill`: the backfill whose record counts the tick, and which claim of it;
    /// `redelivered` when an earlier claim's node went and the tick may have run there.
    Backfill { claim: BackfillClaim, redelivered: bool },
}

/// A backfill tick's claim: the backfill's id and the claim's own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackfillClaim {
    pub backfill: String,
    pub claim: String,
}

/// What becomes of a claimed run this node does not start (its leadership ended, its lease may
/// have expired).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotStarted {
    /// It stays pending in the job's record: the next leader delivers it or records it lost.
    StaysOwed,
    /// No record lists it: recorded `lost` here.
    RecordedLost,
    /// It goes back to its backfill's record, to be claimed again.
    GivenBack,
}

impl Arrival {
    /// Whether the run takes its job's turn on this node: it waits behind the job's run going
    /// here, the `overlap` policy applies to it, and its run sets how long the job takes. A
    /// backfill's run takes none (`--parallel` may run several): it is claimed only while no
    /// live run of the job goes or waits here, and live ticks wait for it instead.
    pub fn takes_turn(&self) -> bool {
        !matches!(self, Arrival::Backfill { .. })
    }

    /// Whether a blackout covering its tick skips it: a run asked for by hand is an operator's
    /// own choice and goes ahead; a backfill's historic tick inside one is skipped as it was.
    pub fn kept_out_by_blackouts(&self) -> bool {
        !matches!(self, Arrival::Manual(_))
    }

    /// Whether a record of the schedule owes the run: it starts through its leadership's ticket,
    /// and its start is written with it. A run asked for by hand or a backfill's takes no
    /// ticket, and is listed as going by a write of its own.
    pub fn owed_to_schedule(&self) -> bool {
        matches!(self, Arrival::Scheduled | Arrival::CaughtUp | Arrival::Redelivered)
    }

    /// Whether the run is late: it waits for one of the node's late-run permits, the `skip`
    /// policy never skips it for a run it meets, and a backlog never outruns it.
    pub fn runs_late(&self) -> bool {
        matches!(self, Arrival::CaughtUp | Arrival::Redelivered)
    }

    /// `CRON_REDELIVERED`: the tick may have run before, on a node that went.
    pub fn redelivered(&self) -> bool {
        matches!(self, Arrival::Redelivered | Arrival::Backfill { redelivered: true, .. })
    }

    /// When the run counts as due, for pauses and a concurrency group's line and wait: its
    /// tick, or `now` for a backfill's, whose tick is long past (a pause that ended, or a
    /// deadline from then, must not settle it).
    pub fn due_at(&self, scheduled_at: DateTime<Utc>, now: DateTime<Utc>) -> DateTime<Utc> {
        match self {
            Arrival::Backfill { .. } => now,
            _ => scheduled_at,
        }
    }

    /// What becomes of the run when this node does not start it.
    pub fn not_started(&self) -> NotStarted {
        match self {
            Arrival::Scheduled | Arrival::CaughtUp | Arrival::Redelivered => NotStarted::StaysOwed,
            Arrival::Manual(_) => NotStarted::RecordedLost,
            Arrival::Backfill { .. } => NotStarted::GivenBack,
        }
    }

    /// `CRON_TRIGGER`: a tick of the schedule, a run asked for by `shardcron trigger`, or a past
    /// tick run again by `shardcron backfill`.
    pub fn trigger(&self) -> Trigger {
        match self {
            Arrival::Scheduled | Arrival::CaughtUp | Arrival::Redelivered => Trigger::Schedule,
            Arrival::Manual(_) => Trigger::Manual,
            Arrival::Backfill { .. } => Trigger::Backfill,
        }
    }

    /// The request a run asked for by hand answers.
    pub fn request(&self) -> Option<&str> {
        match self {
            Arrival::Manual(request) => Some(request),
            _ => None,
        }
    }

    /// The backfill claim a backfill's run counts in.
    pub fn backfill_claim(&self) -> Option<&BackfillClaim> {
        match self {
            Arrival::Backfill { claim, .. } => Some(claim),
            _ => None,
        }
    }
}
