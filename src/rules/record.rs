//! The values shardcron keeps in etcd, as they are serialised there and in `status --json`.
//!
//! Their JSON shapes are a contract: operators' scripts read them through `status --json`, and
//! nodes of different versions read each other's records during a rolling upgrade.

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Serialize};

use crate::rules::pools::Tags;

/// The value of `/jobs/<job>/last`. Its default (the epoch, term 0, nothing listed) is only a
/// base for records built by hand: tests, benchmarks, models.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Claim {
    /// The newest tick claimed.
    pub scheduled_at: DateTime<Utc>,
    /// The term of the leader that wrote the record (its election key's create revision). A
    /// run's `CRON_FENCE` is the revision of the write that claimed its tick instead. Stored as
    /// `fence`, the name it had before runs got a fence of their own: records of every version
    /// read alike.
    #[serde(rename = "fence")]
    pub term: i64,
    pub node: String,
    /// Claimed ticks that had not started when the record was written, oldest first. The next
    /// leader of the same election delivers them again (`delivery = "at-least-once"`) or
    /// records them `lost`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pending: Vec<DateTime<Utc>>,
    /// The shard count of the election whose leader wrote the record, with `pending`: only a
    /// later leader of that election knows the writer is deposed. A node running another shard
    /// count (a rolling change of `shards`) may still be about to start those ticks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shards: Option<u32>,
    /// The pool of that election (tags joined by `+`; `@<node>` for a node's own election),
    /// with `pending`; `None` for the fleet's elections.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    /// The schedule that made `scheduled_at` a tick (expression and zone). A new leader catches
    /// up nothing for a job whose schedule changed since: the ticks the new schedule would have
    /// had before the change never existed. Records written before this field: `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<String>,
    /// Pending ticks of other leaders than the writer, each with who owes them: a leader of
    /// another term or another shard count that wrote the record before. The writer keeps them
    /// listed for whoever settles them (the next leader of the owner's election, or any leader
    /// once no node runs the owner's shard count), so a write never drops or takes for its own
    /// a tick another leader may still start.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub others: Vec<Debt>,
    /// The writer's leadership had ended, and every run it was spawning had settled, when it
    /// wrote `pending`: none of those ticks started or ever will. A successor runs them as
    /// never started; without the mark, a tick not due yet by the successor's clock may still
    /// have started on a writer whose clock ran ahead.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub released: bool,
    /// Runs of the job going on when the record was written, as its writer knew them: its own,
    /// and other nodes' it has not seen end. A leader of an `overlap = "skip"` or `"replace"`
    /// job does not start a tick beside one while etcd shows it going. Riding the writes that
    /// claims make anyway, they cost no write of their own. Records written before the field:
    /// none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub going: Vec<Going>,
}

/// A run of a job going on a node, as a record lists it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Going {
    pub node: String,
    pub tick: DateTime<Utc>,
    /// The run's `CRON_FENCE`: it has ended once the job's result holds this fence or a higher
    /// one.
    pub fence: i64,
    /// The lease the node keeps while its runs go on (see `coord::groups`): the run counts as
    /// ended once etcd no longer holds it.
    pub lease: i64,
    /// When it started, by its node's clock.
    pub since: DateTime<Utc>,
}

/// Ticks a leader claimed and had not started when its record was last written by itself.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Debt {
    /// The owner's term (its election key's create revision).
    pub term: i64,
    pub node: String,
    /// The shard count of the owner's election; `None` only for records written before the
    /// field, read as the reader's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shards: Option<u32>,
    /// The pool of the owner's election; `None` for the fleet's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    pub pending: Vec<DateTime<Utc>>,
    /// As [`Claim::released`], for the owner's own last write.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub released: bool,
}

impl Claim {
    /// Every leader's pending ticks the record lists: the writer's own first, then the others'.
    pub fn debts(&self) -> impl Iterator<Item = Debt> + '_ {
        let own = (!self.pending.is_empty()).then(|| Debt {
            term: self.term,
            node: self.node.clone(),
            shards: self.shards,
            pool: self.pool.clone(),
            pending: self.pending.clone(),
            released: self.released,
        });
        own.into_iter().chain(self.others.iter().cloned())
    }

    /// Every pending tick the record lists, whoever owes it.
    pub fn listed(&self) -> Vec<DateTime<Utc>> {
        let mut ticks: Vec<DateTime<Utc>> = self
            .pending
            .iter()
            .chain(self.others.iter().flat_map(|debt| &debt.pending))
            .copied()
            .collect();
        ticks.sort_unstable();
        ticks.dedup();
        ticks
    }
}

impl Debt {
    /// Whether the leader of `term` on `node` owes these ticks.
    pub fn owed_by(&self, term: i64, node: &str) -> bool {
        self.term == term && self.node == node
    }
}

/// The value of `/jobs/<job>/result`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunRecord {
    pub scheduled_at: DateTime<Utc>,
    /// The run's `CRON_FENCE`: the revision of the write that claimed the tick.
    pub fence: i64,
    pub node: String,
    pub outcome: Outcome,
    pub exit_code: Option<i32>,
    pub duration_ms: u64,
    pub finished_at: DateTime<Utc>,
    /// How many times the command was started for this tick (1 + retries used; 0 if skipped).
    #[serde(default = "one")]
    pub attempts: u32,
    /// What made the run: its schedule, or `shardcron trigger`. Records written before this
    /// field are schedule runs.
    #[serde(default)]
    pub trigger: Trigger,
    /// The blackout a `skipped` tick fell in (`[blackouts.<name>]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blackout: Option<String>,
    /// The last bytes of its output (`output_tail`), kept in its history entry only: never in
    /// the job's result or claim record. `None` for a run that kept none, or was not run.
    #[serde(flatten)]
    pub output: Option<RunOutput>,
}

/// The kept tails of a run's stdout and stderr, each cut where a character starts.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunOutput {
    pub stdout: String,
    pub stderr: String,
    /// The stream printed more than the tail holds.
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
}

/// What made a run (`CRON_TRIGGER`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Trigger {
    /// A tick of the job's schedule.
    #[default]
    Schedule,
    /// A run asked for with `shardcron trigger`.
    Manual,
    /// A past tick run again by `shardcron backfill`.
    Backfill,
}

impl Trigger {
    /// The name in records and `CRON_TRIGGER`.
    pub fn as_str(self) -> &'static str {
        match self {
            Trigger::Schedule => "schedule",
            Trigger::Manual => "manual",
            Trigger::Backfill => "backfill",
        }
    }

    /// A tick of this trigger as logs, messages and `CRON_SCHEDULED_AT` show it, RFC 3339 in
    /// UTC: a schedule's tick to the second; a manual run's, the instant it was asked for, to
    /// the millisecond, so that two runs asked for within a second read apart.
    pub fn tick_shown(self, tick: DateTime<Utc>) -> String {
        let precision = match self {
            Trigger::Schedule | Trigger::Backfill => SecondsFormat::Secs,
            Trigger::Manual => SecondsFormat::Millis,
        };
        tick.to_rfc3339_opts(precision, true)
    }
}

impl RunRecord {
    /// The outcome as the text tables show it: a tick skipped in a blackout names it, with no
    /// space, so that the column splits as the others do: `skipped(blackout=freeze)`.
    pub fn outcome_shown(&self) -> String {
        match &self.blackout {
            Some(blackout) => format!("{}(blackout={blackout})", self.outcome),
            None => self.outcome.to_string(),
        }
    }

    /// The command ran and exited 0.
    pub fn succeeded(&self) -> bool {
        self.outcome == Outcome::Exited && self.exit_code == Some(0)
    }
}

fn one() -> u32 {
    1
}

#[cfg(test)]
impl RunRecord {
    /// A successful one-attempt run of the tick at `at`, finished then, for unit tests.
    pub(crate) fn for_tests(at: DateTime<Utc>, fence: i64) -> RunRecord {
        RunRecord {
            scheduled_at: at,
            fence,
            node: "n".into(),
            outcome: Outcome::Exited,
            exit_code: Some(0),
            duration_ms: 1,
            finished_at: at,
            attempts: 1,
            trigger: Trigger::Schedule,
            output: None,
            blackout: None,
        }
    }
}

/// How a claimed tick ended on the node that claimed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The command ran and exited by itself; `exit_code` says how.
    Exited,
    /// The command was killed: the shutdown grace ran out, or it stayed silent past its lease
    /// gate's deadline and printed the gate's line only once killed.
    Killed,
    /// The job's `timeout` ran out.
    Timeout,
    /// A newer tick replaced the run (`overlap = "replace"`), or replaced it before it started.
    Replaced,
    /// The command could not be started.
    SpawnFailed,
    /// Not run: the job's previous run was still going (`overlap = "skip"`).
    Skipped,
    /// Claimed, and its start never recorded: its leader died, stalled or stopped first. For an
    /// `at-most-once` job, or a tick past its `starting_deadline`, the next leader records this
    /// instead of running the tick.
    Lost,
    /// Not run: the job was paused (`shardcron pause`) at the tick or when it was due to start.
    Paused,
    /// Not run: the job's concurrency group stayed full for as long as the tick could wait
    /// (the group's `wait`, by default until the job's next tick).
    GroupFull,
}

impl Outcome {
    /// The name stored in etcd and printed by `status`.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Exited => "exited",
            Outcome::Killed => "killed",
            Outcome::Timeout => "timeout",
            Outcome::Replaced => "replaced",
            Outcome::SpawnFailed => "spawn_failed",
            Outcome::Skipped => "skipped",
            Outcome::Lost => "lost",
            Outcome::Paused => "paused",
            Outcome::GroupFull => "group_full",
        }
    }
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The value of `/nodes/<id>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    pub version: String,
    /// seahash of the node's jobs.toml: nodes that differ run different jobs.
    pub digest: String,
    pub shards: u32,
    pub started_at: DateTime<Utc>,
    /// The node's tags (`--tags`): which pools it may campaign in.
    #[serde(default, skip_serializing_if = "Tags::is_empty")]
    pub tags: Tags,
    /// The shard count of every pool the node campaigns in.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub pool_shards: u32,
    /// The ids of the pools the node campaigns in: its config's pools whose tags it has.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pools: Vec<String>,
    /// The etcd member the node's calls go to first (scheme, host and port), as of the last
    /// change: which member a node talks to while one is in trouble.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd: Option<String>,
}

fn is_zero(value: &u32) -> bool {
    *value == 0
}

impl Member {
    /// Whether the node campaigns in the elections of `pool` (`None`: the fleet's) of `shards`.
    pub fn runs(&self, pool: Option<&str>, shards: u32) -> bool {
        match pool {
            None => self.shards == shards,
            Some(pool) => self.pool_shards == shards && self.pools.iter().any(|own| own == pool),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_are_stored_by_their_snake_case_names() {
        for outcome in [
            Outcome::Exited,
            Outcome::Killed,
            Outcome::Timeout,
            Outcome::Replaced,
            Outcome::SpawnFailed,
            Outcome::Skipped,
            Outcome::Lost,
            Outcome::Paused,
        ] {
            let json = serde_json::to_string(&outcome).unwrap();
            assert_eq!(json, format!("\"{}\"", outcome.as_str()));
            assert_eq!(serde_json::from_str::<Outcome>(&json).unwrap(), outcome);
        }
    }

    #[test]
    fn a_manual_tick_is_shown_to_the_millisecond_and_a_schedules_to_the_second() {
        let at = DateTime::<Utc>::from_timestamp(1_800_000_000, 123_456_789).unwrap();
        let cases = [
            (Trigger::Schedule, "2027-01-15T08:00:00Z"),
            (Trigger::Backfill, "2027-01-15T08:00:00Z"),
            (Trigger::Manual, "2027-01-15T08:00:00.123Z"),
        ];
        for (trigger, shown) in cases {
            assert_eq!(trigger.tick_shown(at), shown, "{trigger:?}");
        }
    }

    #[test]
    fn a_run_record_keeps_its_json_shape() {
        let at = DateTime::<Utc>::from_timestamp(1_800_000_000, 0).unwrap();
        let record = RunRecord {
            scheduled_at: at,
            fence: 7,
            node: "a".into(),
            outcome: Outcome::SpawnFailed,
            exit_code: None,
            duration_ms: 3,
            finished_at: at,
            attempts: 2,
            trigger: Trigger::Manual,
            output: None,
            blackout: None,
        };
        assert_eq!(
            serde_json::to_string(&record).unwrap(),
            r#"{"scheduled_at":"2027-01-15T08:00:00Z","fence":7,"node":"a","outcome":"spawn_failed","exit_code":null,"duration_ms":3,"finished_at":"2027-01-15T08:00:00Z","attempts":2,"trigger":"manual"}"#
        );
    }

    #[test]
    fn a_claim_record_keeps_its_json_shape_and_reads_the_records_of_earlier_versions() {
        let at = DateTime::<Utc>::from_timestamp(1_800_000_000, 0).unwrap();
        let claim = Claim {
            scheduled_at: at,
            term: 7,
            node: "a".into(),
            pending: vec![at],
            shards: Some(4),
            pool: None,
            schedule: Some("*/5 * * * * *".into()),
            others: vec![Debt {
                term: 5,
                node: "b".into(),
                shards: Some(2),
                pool: None,
                pending: vec![at],
                released: true,
            }],
            released: false,
            going: Vec::new(),
        };
        // The term is stored as `fence`, the name a record has had since the first version.
        let stored = r#"{"scheduled_at":"2027-01-15T08:00:00Z","fence":7,"node":"a","pending":["2027-01-15T08:00:00Z"],"shards":4,"schedule":"*/5 * * * * *","others":[{"term":5,"node":"b","shards":2,"pending":["2027-01-15T08:00:00Z"],"released":true}]}"#;
        assert_eq!(serde_json::to_string(&claim).unwrap(), stored);
        assert_eq!(serde_json::from_str::<Claim>(stored).unwrap(), claim);
        let oldest = r#"{"scheduled_at":"2027-01-15T08:00:00Z","fence":3,"node":"a"}"#;
        assert_eq!(serde_json::from_str::<Claim>(oldest).unwrap().term, 3);
    }
}
