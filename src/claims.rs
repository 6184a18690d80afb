//! The claim protocol, end to end: how a leader commits to running ticks.
//!
//! A claim writes each job's `/last` record in one transaction guarded by the leader key's fence
//! and by each record being unchanged since the leader read it, so a tick is claimed at most once
//! even while two nodes both believe they lead. Claims are batched under etcd's operation limit,
//! and finished runs' results ride in the room a batch leaves. When a transaction is rejected or
//! its outcome is unknown, the records are read again and each tick resolved: a claim that landed
//! is ours, a record that moved to or past the tick means another leader ran it, anything else is
//! claimed again while this node still leads.
//!
//! The [`Book`] is what a leader knows of its jobs' records: the revision a claim must find and
//! the last claimed tick, read once per leadership and kept current by every claim.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;

use crate::backoff::{sleep_or_cancel, Backoff};
use crate::config::Job;
use crate::election::{self, Leadership};
use crate::etcd::CoordError;
use crate::keys::Keys;
use crate::ledger::{self, ClaimRequest, Seen, MAX_OPS_PER_TXN};
use crate::record::{Claim, RunRecord};
use crate::results::ResultQueue;
use crate::session::Session;
use crate::starts::Starts;

/// How far ahead of a tick to claim it: a few times the recent claim latency, within bounds.
///
/// Claiming ahead keeps the etcd round trip out of the spawn's lateness. The lead is also the
/// window in which a leader that dies after claiming a tick loses it, so it is kept as short as
/// the measured latency allows instead of a fixed generous margin.
#[derive(Clone)]
pub(crate) struct ClaimLead {
    average_micros: Arc<AtomicU64>,
}

impl ClaimLead {
    const MIN: Duration = Duration::from_millis(3);
    const MAX: Duration = Duration::from_millis(50);
    const INITIAL: Duration = Duration::from_millis(10);

    pub(crate) fn new() -> Self {
        ClaimLead {
            average_micros: Arc::new(AtomicU64::new(Self::INITIAL.as_micros() as u64 / 3)),
        }
    }

    pub(crate) fn lead(&self) -> Duration {
        let average = Duration::from_micros(self.average_micros.load(Ordering::Relaxed));
        (average * 3).clamp(Self::MIN, Self::MAX)
    }

    /// Folds one claim's round trip into the moving average (weight 1/8).
    pub(crate) fn observe(&self, took: Duration) {
        let took = took.as_micros().min(u128::from(u32::MAX)) as u64;
        let average = self.average_micros.load(Ordering::Relaxed);
        self.average_micros
            .store(average - average / 8 + took / 8, Ordering::Relaxed);
    }
}

/// One job of a term and what its leader knows of the job's record.
pub(crate) struct Entry {
    pub(crate) job: Arc<Job>,
    /// The record's mod revision, which the next write must find unchanged; 0 for no record.
    revision: i64,
    /// The record as etcd holds it, as far as this leader knows.
    record: Option<Claim>,
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
}

/// The jobs of one shard, indexed as the term queues them, with what their leader knows of them.
#[derive(Default)]
pub(crate) struct Book {
    entries: Vec<Entry>,
    by_name: HashMap<String, usize>,
}

impl std::fmt::Debug for Book {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} jobs remembered", self.entries.len())
    }
}

impl Book {
    fn new(entries: Vec<Entry>) -> Book {
        let by_name = entries
            .iter()
            .enumerate()
            .map(|(index, entry)| (entry.job.name.clone(), index))
            .collect();
        Book { entries, by_name }
    }

    pub(crate) fn entries(&self) -> &[Entry] {
        &self.entries
    }

    pub(crate) fn job(&self, index: usize) -> &Arc<Job> {
        &self.entries[index].job
    }

    fn learn(&mut self, index: usize, seen: &Seen) {
        let entry = &mut self.entries[index];
        entry.revision = seen.mod_revision;
        entry.record = seen.claim.clone();
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
    /// This write settles an earlier leader's pending ticks (each adopted or recorded lost), so
    /// the record stops listing them.
    pub(crate) takes_over: bool,
    /// Only writes the starts of ticks this leader owed.
    starts_only: bool,
}

impl Want {
    /// Claims one new tick.
    pub(crate) fn tick(index: usize, tick: DateTime<Utc>) -> Want {
        Want {
            index,
            fresh: vec![tick],
            adopt: Vec::new(),
            takes_over: false,
            starts_only: false,
        }
    }

    /// What a new leader claims for a job: missed ticks, and pending ticks of an earlier leader
    /// to adopt, or to take over without running when `takes_over` and `adopt` is empty.
    pub(crate) fn catch_up(
        index: usize,
        fresh: Vec<DateTime<Utc>>,
        adopt: Vec<DateTime<Utc>>,
        takes_over: bool,
    ) -> Want {
        Want {
            index,
            fresh,
            adopt,
            takes_over,
            starts_only: false,
        }
    }

    fn starts_only(index: usize) -> Want {
        Want {
            index,
            fresh: Vec::new(),
            adopt: Vec::new(),
            takes_over: false,
            starts_only: true,
        }
    }
}

/// A job's ticks that a claim won: this leader owes them now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Won {
    pub(crate) index: usize,
    pub(crate) fresh: Vec<DateTime<Utc>>,
    pub(crate) adopt: Vec<DateTime<Utc>>,
}

/// How a claim ended when it did not claim what it was asked to: the term decides what follows.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Halt {
    /// Shutdown before anything was claimed.
    Stopped,
    /// The session is lost, or its lease may have expired by this node's own clock.
    SessionLost,
    /// A claim was rejected and another candidate leads now.
    Deposed,
}

/// What a record read after an unsettled write says about it.
#[derive(Debug, PartialEq, Eq)]
enum Resolution {
    /// The write landed.
    Ours,
    /// The record is as it was: nothing landed and nobody else wrote; write again.
    Open,
    /// Another leader wrote the record meanwhile.
    Changed,
}

/// Resolves a write of `intended` over a record at `expected_revision` from the record read
/// after it.
fn resolve(seen: &Seen, expected_revision: i64, intended: &Claim) -> Resolution {
    if seen.mod_revision == expected_revision {
        Resolution::Open
    } else if seen.claim.as_ref() == Some(intended) {
        Resolution::Ours
    } else {
        Resolution::Changed
    }
}

/// The record a leader with `fence` on `node` writes for `want` over `current`, owing `owed`.
///
/// The pending list is what the leader owes after the write: ticks owed from earlier claims,
/// the new ones and the adopted ones. Another leader's pending ticks stay listed unless this
/// write takes them over, so no write ever drops a tick someone still owes. `None` when there
/// is nothing to write: no record and no tick.
fn next_record(current: Option<&Claim>, want: &Want, owed: &BTreeSet<DateTime<Utc>>, writer: &Writer) -> Option<Claim> {
    let Writer { fence, node, shards } = *writer;
    let mut pending = owed.clone();
    pending.extend(want.fresh.iter().chain(&want.adopt).copied());
    if let Some(current) = current {
        let theirs = current.fence != fence || current.node != node;
        if theirs && !want.takes_over {
            pending.extend(current.pending.iter().copied());
        }
    }
    let newest = want.fresh.iter().max().copied();
    let scheduled_at = match (current.map(|claim| claim.scheduled_at), newest) {
        (Some(last), Some(newest)) => last.max(newest),
        (last, newest) => last.or(newest)?,
    };
    Some(Claim {
        scheduled_at,
        fence,
        node: node.to_string(),
        shards: (!pending.is_empty()).then_some(shards),
        pending: pending.into_iter().collect(),
    })
}

/// Who writes a record: a leader's fence, node and election.
struct Writer<'a> {
    fence: i64,
    node: &'a str,
    shards: u32,
}

/// `items` in groups of at most as many as one claim transaction takes.
pub(crate) fn batches<T>(items: &[T]) -> std::slice::Chunks<'_, T> {
    items.chunks(MAX_OPS_PER_TXN)
}

/// How many more operations fit in a claim that already has `used`.
fn room(used: usize) -> usize {
    MAX_OPS_PER_TXN.saturating_sub(used)
}

/// A leader's claims for one shard: borrowed from its term for the length of a claim.
pub(crate) struct Claimer<'a> {
    pub(crate) session: &'a Session,
    pub(crate) keys: &'a Keys,
    pub(crate) leadership: &'a Leadership,
    pub(crate) node_id: &'a str,
    pub(crate) starts: &'a Starts,
    pub(crate) results: &'a ResultQueue,
    pub(crate) lead: &'a ClaimLead,
    pub(crate) shutdown: &'a CancellationToken,
}

/// Pause between attempts when etcd fails a call during a term.
const RETRY_PAUSE: Duration = Duration::from_millis(200);

impl Claimer<'_> {
    /// The book of `jobs`: what `known` (the previous term of this leadership) knew, and etcd's
    /// records for the jobs it did not know.
    pub(crate) async fn open_book(&self, jobs: Vec<Arc<Job>>, known: Book) -> Result<Book, Halt> {
        let mut known: HashMap<String, Entry> = known
            .entries
            .into_iter()
            .map(|entry| (entry.job.name.clone(), entry))
            .collect();
        let unknown: Vec<&str> = jobs
            .iter()
            .map(|job| job.name.as_str())
            .filter(|name| !known.contains_key(*name))
            .collect();
        let seen = self
            .retry(|| ledger::read_claims(self.session, self.keys, &unknown))
            .await?;
        let mut seen = seen.into_iter();
        let entries = jobs
            .iter()
            .map(|job| match known.remove(&job.name) {
                Some(entry) => Entry {
                    job: Arc::clone(job),
                    ..entry
                },
                None => {
                    let read = seen.next().unwrap_or_default();
                    Entry {
                        job: Arc::clone(job),
                        revision: read.mod_revision,
                        record: read.claim,
                    }
                }
            })
            .collect();
        Ok(Book::new(entries))
    }

    /// Writes each of `wants`, in transactions of at most [`MAX_OPS_PER_TXN`] records, with the
    /// starts not yet written riding along, and returns the ticks won. With no wants it writes
    /// only the starts. After a shutdown it claims nothing new and only writes starts and
    /// takeovers.
    pub(crate) async fn claim(&self, book: &mut Book, wants: &[Want]) -> Result<Vec<Won>, Halt> {
        if wants.is_empty() {
            return self.claim_chunk(book, Vec::new()).await;
        }
        let mut won = Vec::with_capacity(wants.len());
        for chunk in batches(wants) {
            won.extend(self.claim_chunk(book, chunk.to_vec()).await?);
        }
        Ok(won)
    }

    /// One guarded transaction for at most [`MAX_OPS_PER_TXN`] records, repeated after a
    /// rejection or an unknown outcome until every want is settled.
    async fn claim_chunk(&self, book: &mut Book, mut wants: Vec<Want>) -> Result<Vec<Won>, Halt> {
        for want in &mut wants {
            let last = book.entries[want.index].last();
            want.fresh.retain(|tick| last.is_none_or(|last| last < *tick));
        }
        wants.retain(|want| !want.fresh.is_empty() || !want.adopt.is_empty() || want.takes_over);
        let mut won = Vec::with_capacity(wants.len());
        let mut riding_starts = Vec::new();
        let result = self.settle(book, &mut wants, &mut won, &mut riding_starts).await;
        if result.is_err() {
            self.starts.unrecord(riding_starts);
        }
        result.map(|()| won)
    }

    async fn settle(
        &self,
        book: &mut Book,
        wants: &mut Vec<Want>,
        won: &mut Vec<Won>,
        riding_starts: &mut Vec<(String, std::time::Instant)>,
    ) -> Result<(), Halt> {
        loop {
            if self.shutdown.is_cancelled() {
                wants.retain(|want| want.fresh.is_empty() && want.adopt.is_empty());
            }
            let named: Vec<&str> = wants
                .iter()
                .map(|want| book.entries[want.index].job.name.as_str())
                .collect();
            let taken = self.starts.take_unrecorded(room(wants.len()), &named);
            for (job, since) in taken {
                match book.by_name.get(&job) {
                    Some(&index) if book.entries[index].record.is_some() => {
                        if !wants.iter().any(|want| want.index == index) {
                            wants.push(Want::starts_only(index));
                        }
                        riding_starts.push((job, since));
                    }
                    // A job a reload removed: its pending ticks go to whoever leads it next.
                    _ => {}
                }
            }
            if wants.is_empty() {
                return Ok(());
            }
            if !self.session.check_live() {
                return Err(Halt::SessionLost);
            }
            let intended: Vec<Option<Claim>> = wants
                .iter()
                .map(|want| {
                    let entry = &book.entries[want.index];
                    let owed = self.starts.owed(&entry.job.name);
                    let writer = Writer {
                        fence: self.leadership.fence,
                        node: self.node_id,
                        shards: self.leadership.shards,
                    };
                    next_record(entry.record.as_ref(), want, &owed, &writer)
                })
                .collect();
            match self.commit(book, wants, &intended).await {
                Ok(Some(revision)) => {
                    for (want, intended) in wants.drain(..).zip(intended) {
                        self.won(book, want, intended, revision, won);
                    }
                    riding_starts.clear();
                    return Ok(());
                }
                Ok(None) => {
                    crate::metrics::get().claim_failures.inc();
                    tracing::warn!(
                        shard = self.leadership.shard,
                        fence = self.leadership.fence,
                        "claim rejected by etcd: re-checking leadership"
                    );
                    match election::still_leads(self.session, self.leadership).await {
                        Ok(true) => {}
                        Ok(false) => return Err(Halt::Deposed),
                        Err(err) => self.pause_after(&err).await?,
                    }
                }
                Err(err) => self.pause_after(&err).await?,
            }
            let names: Vec<&str> = wants
                .iter()
                .map(|want| book.entries[want.index].job.name.as_str())
                .collect();
            let seen = self
                .retry(|| ledger::read_claims(self.session, self.keys, &names))
                .await?;
            let mut open = Vec::new();
            for ((mut want, intended), seen) in wants.drain(..).zip(intended).zip(seen) {
                let expected = book.entries[want.index].revision;
                let resolution = match &intended {
                    Some(intended) => resolve(&seen, expected, intended),
                    None => Resolution::Changed,
                };
                match resolution {
                    Resolution::Ours => self.won(book, want, intended, seen.mod_revision, won),
                    Resolution::Open => open.push(want),
                    Resolution::Changed => {
                        book.learn(want.index, &seen);
                        let last = book.entries[want.index].last();
                        let claimed = want.fresh.len();
                        want.fresh.retain(|tick| last.is_none_or(|last| last < *tick));
                        if want.fresh.len() < claimed {
                            tracing::info!(job = %book.entries[want.index].job.name, "tick already claimed by another leader: not running it here");
                        }
                        // Another leader wrote the record: its pending ticks are its own now.
                        want.adopt.clear();
                        want.takes_over = false;
                        if !want.fresh.is_empty() {
                            open.push(want);
                        }
                    }
                }
            }
            *wants = open;
        }
    }

    /// Books a write that landed: the record is `intended` at `revision`, and its new and
    /// adopted ticks are owed.
    fn won(&self, book: &mut Book, want: Want, intended: Option<Claim>, revision: i64, won: &mut Vec<Won>) {
        let entry = &mut book.entries[want.index];
        entry.revision = revision;
        entry.record = intended;
        self.starts
            .owe(&entry.job.name, want.fresh.iter().chain(&want.adopt).copied());
        if !want.starts_only {
            won.push(Won {
                index: want.index,
                fresh: want.fresh,
                adopt: want.adopt,
            });
        }
    }

    /// Confirms, with a linearizable read, that this leadership still leads: what lets a tick
    /// claimed ahead start on time. A leader cut off from etcd since its claim does not start it,
    /// so the next leader can deliver it without running it twice. Retries a failed read while
    /// the session lasts.
    pub(crate) async fn confirm(&self) -> Result<(), Halt> {
        loop {
            match election::still_leads(self.session, self.leadership).await {
                Ok(true) => return Ok(()),
                Ok(false) => return Err(Halt::Deposed),
                Err(err) => self.pause_after(&err).await?,
            }
        }
    }

    /// Sends one guarded transaction writing `intended` for `wants`, with earlier runs' results
    /// riding in the room left: the claim is a write etcd makes anyway. `Ok(None)` means a
    /// guard failed and nothing was written.
    async fn commit(&self, book: &Book, wants: &[Want], intended: &[Option<Claim>]) -> Result<Option<i64>, CoordError> {
        let requests: Vec<ClaimRequest> = wants
            .iter()
            .zip(intended)
            .filter_map(|(want, claim)| {
                let entry = &book.entries[want.index];
                Some(ClaimRequest {
                    job: entry.job.name.clone(),
                    expected_revision: entry.revision,
                    claim: claim.clone()?,
                })
            })
            .collect();
        let riders = self.results.take_for(self.leadership.shard, room(requests.len()));
        let carried: Vec<(&str, &RunRecord)> = riders.iter().map(|rider| (rider.job.as_str(), &rider.record)).collect();
        let sent = std::time::Instant::now();
        let outcome = ledger::claim(self.session, self.keys, self.leadership, &requests, &carried).await;
        self.lead.observe(sent.elapsed());
        self.results.settle(riders, matches!(outcome, Ok(Some(_))));
        outcome
    }

    /// Retries an etcd read until it succeeds or the term must end.
    async fn retry<T, F, Fut>(&self, mut call: F) -> Result<T, Halt>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, CoordError>>,
    {
        loop {
            match call().await {
                Ok(value) => return Ok(value),
                Err(err) => self.pause_after(&err).await?,
            }
        }
    }

    async fn pause_after(&self, err: &CoordError) -> Result<(), Halt> {
        tracing::warn!(shard = self.leadership.shard, error = %err, "etcd call failed during the term; retrying");
        let pause = Backoff::new(RETRY_PAUSE, RETRY_PAUSE).next_delay();
        if !sleep_or_cancel(pause, self.session.ended()).await {
            return Err(if self.shutdown.is_cancelled() {
                Halt::Stopped
            } else {
                Halt::SessionLost
            });
        }
        if self.session.check_live() {
            Ok(())
        } else {
            Err(Halt::SessionLost)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claim_lead_follows_latency_within_bounds() {
        let lead = ClaimLead::new();
        assert_eq!(lead.lead(), Duration::from_millis(10) - Duration::from_micros(1));
        for _ in 0..100 {
            lead.observe(Duration::from_micros(500));
        }
        assert_eq!(lead.lead(), ClaimLead::MIN);
        for _ in 0..100 {
            lead.observe(Duration::from_millis(8));
        }
        assert!(
            lead.lead() > Duration::from_millis(20) && lead.lead() <= Duration::from_millis(24),
            "{:?}",
            lead.lead()
        );
        for _ in 0..100 {
            lead.observe(Duration::from_secs(1));
        }
        assert_eq!(lead.lead(), ClaimLead::MAX);
    }

    fn at(second: i64) -> DateTime<Utc> {
        DateTime::<Utc>::from_timestamp(1_800_000_000 + second, 0).unwrap()
    }

    fn claim(second: i64, fence: i64, node: &str, pending: &[i64]) -> Claim {
        Claim {
            shards: (!pending.is_empty()).then_some(4),
            scheduled_at: at(second),
            fence,
            node: node.into(),
            pending: pending.iter().map(|second| at(*second)).collect(),
        }
    }

    #[test]
    fn a_re_read_record_settles_each_write() {
        let ours = claim(10, 5, "a", &[10]);
        let seen = |revision: i64, claim: Option<Claim>| Seen {
            claim,
            mod_revision: revision,
        };
        let cases = [
            (
                seen(7, Some(claim(9, 3, "b", &[]))),
                Resolution::Open,
                "unchanged since read: write again",
            ),
            (seen(0, None), Resolution::Open, "still no record"),
            (seen(8, Some(ours.clone())), Resolution::Ours, "our write landed"),
            (
                seen(8, Some(claim(10, 7, "b", &[10]))),
                Resolution::Changed,
                "another leader claimed the tick",
            ),
            (
                seen(8, Some(claim(9, 7, "b", &[]))),
                Resolution::Changed,
                "another leader wrote an older tick",
            ),
            (
                seen(8, Some(claim(10, 5, "a", &[]))),
                Resolution::Changed,
                "the same tick with other pending ticks is not our write",
            ),
        ];
        for (seen, expected, why) in cases {
            let expected_revision = if seen.claim.is_none() { 0 } else { 7 };
            assert_eq!(resolve(&seen, expected_revision, &ours), expected, "{why}");
        }
    }

    #[test]
    fn the_next_record_lists_what_its_writer_owes_and_keeps_what_others_owe() {
        let owed = |seconds: &[i64]| seconds.iter().map(|second| at(*second)).collect::<BTreeSet<_>>();
        let want = |fresh: &[i64], adopt: &[i64], takes_over: bool| Want {
            index: 0,
            fresh: fresh.iter().map(|second| at(*second)).collect(),
            adopt: adopt.iter().map(|second| at(*second)).collect(),
            takes_over,
            starts_only: false,
        };
        let cases = [
            (
                None,
                want(&[10], &[], false),
                owed(&[]),
                Some(claim(10, 5, "a", &[10])),
                "a first claim",
            ),
            (
                Some(claim(9, 5, "a", &[9])),
                want(&[10], &[], false),
                owed(&[]),
                Some(claim(10, 5, "a", &[10])),
                "tick 9 started since: only 10 is owed",
            ),
            (
                Some(claim(9, 5, "a", &[9])),
                want(&[10], &[], false),
                owed(&[9]),
                Some(claim(10, 5, "a", &[9, 10])),
                "a backlog: 9 is still owed",
            ),
            (
                Some(claim(9, 5, "a", &[8, 9])),
                want(&[], &[], false),
                owed(&[9]),
                Some(claim(9, 5, "a", &[9])),
                "writing a start",
            ),
            (
                Some(claim(9, 3, "b", &[9])),
                want(&[10], &[], false),
                owed(&[]),
                Some(claim(10, 5, "a", &[9, 10])),
                "another leader's tick 9 stays listed",
            ),
            (
                Some(claim(9, 3, "b", &[8, 9])),
                want(&[10], &[8, 9], true),
                owed(&[]),
                Some(claim(10, 5, "a", &[8, 9, 10])),
                "a takeover adopts 8 and 9",
            ),
            (
                Some(claim(9, 3, "b", &[8, 9])),
                want(&[], &[], true),
                owed(&[]),
                Some(claim(9, 5, "a", &[])),
                "a takeover that records 8 and 9 lost",
            ),
            (
                Some(claim(9, 3, "b", &[])),
                want(&[5], &[], false),
                owed(&[]),
                Some(claim(9, 5, "a", &[5])),
                "an older tick never moves the record back",
            ),
            (None, want(&[], &[], false), owed(&[]), None, "nothing to write"),
        ];
        for (current, want, owed, expected, why) in cases {
            let writer = Writer {
                fence: 5,
                node: "a",
                shards: 4,
            };
            assert_eq!(next_record(current.as_ref(), &want, &owed, &writer), expected, "{why}");
        }
    }

    #[test]
    fn starts_and_results_fill_only_the_room_claims_leave() {
        for (used, left) in [
            (0, MAX_OPS_PER_TXN),
            (1, MAX_OPS_PER_TXN - 1),
            (MAX_OPS_PER_TXN, 0),
            (MAX_OPS_PER_TXN + 1, 0),
        ] {
            assert_eq!(room(used), left, "{used} used");
        }
    }
}
