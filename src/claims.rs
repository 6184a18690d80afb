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

use std::collections::HashMap;
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
    /// The record's mod revision, which the next claim must find unchanged; 0 for no record.
    pub(crate) revision: i64,
    /// The last tick claimed by anyone, as far as this leader knows.
    pub(crate) last: Option<DateTime<Utc>>,
}

/// The jobs of one shard, indexed as the term queues them, with what their leader knows of them.
#[derive(Default)]
pub(crate) struct Book {
    entries: Vec<Entry>,
}

impl std::fmt::Debug for Book {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} jobs remembered", self.entries.len())
    }
}

impl Book {
    pub(crate) fn entries(&self) -> &[Entry] {
        &self.entries
    }

    pub(crate) fn job(&self, index: usize) -> &Arc<Job> {
        &self.entries[index].job
    }

    fn learn(&mut self, index: usize, seen: &Seen) {
        let entry = &mut self.entries[index];
        entry.revision = seen.mod_revision;
        entry.last = seen.claim.as_ref().map(|claim| claim.scheduled_at);
    }
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

/// What a re-read record says about a tick this leader tried to claim.
#[derive(Debug, PartialEq, Eq)]
enum Resolution {
    /// The claim landed: the tick is ours to run.
    Ours,
    /// Another leader claimed this tick or a later one: not ours to run.
    TakenByOther,
    /// Nobody has claimed it yet: claim it again.
    Open,
}

/// Resolves a claim of `tick` by the leader with `fence` on `node` from the record read after it.
fn resolve(seen: &Seen, tick: DateTime<Utc>, fence: i64, node: &str) -> Resolution {
    match &seen.claim {
        Some(claim) if claim.scheduled_at == tick && claim.fence == fence && claim.node == node => Resolution::Ours,
        Some(claim) if claim.scheduled_at >= tick => Resolution::TakenByOther,
        _ => Resolution::Open,
    }
}

/// `items` in groups of at most as many as one claim transaction takes.
pub(crate) fn batches<T>(items: &[T]) -> std::slice::Chunks<'_, T> {
    items.chunks(MAX_OPS_PER_TXN)
}

/// How many finished runs' results can ride in a claim of `claims` ticks.
fn rider_room(claims: usize) -> usize {
    MAX_OPS_PER_TXN.saturating_sub(claims)
}

/// A leader's claims for one shard: borrowed from its term for the length of a claim.
pub(crate) struct Claimer<'a> {
    pub(crate) session: &'a Session,
    pub(crate) keys: &'a Keys,
    pub(crate) leadership: &'a Leadership,
    pub(crate) node_id: &'a str,
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
                        last: read.claim.map(|claim| claim.scheduled_at),
                    }
                }
            })
            .collect();
        Ok(Book { entries })
    }

    /// Claims each `(index, tick)` of `wanted`, in transactions of at most [`MAX_OPS_PER_TXN`]
    /// claims, and returns the indexes of the jobs whose tick this leader now owns. A tick at or
    /// before the job's last known claim is not claimed again.
    pub(crate) async fn claim(&self, book: &mut Book, wanted: &[(usize, DateTime<Utc>)]) -> Result<Vec<usize>, Halt> {
        let mut claimed = Vec::with_capacity(wanted.len());
        for chunk in batches(wanted) {
            claimed.extend(self.claim_chunk(book, chunk).await?);
        }
        Ok(claimed)
    }

    /// One guarded transaction for at most [`MAX_OPS_PER_TXN`] claims, repeated after a
    /// rejection or an unknown outcome until every tick is resolved.
    async fn claim_chunk(&self, book: &mut Book, chunk: &[(usize, DateTime<Utc>)]) -> Result<Vec<usize>, Halt> {
        let mut wanted: Vec<(usize, DateTime<Utc>)> = chunk
            .iter()
            .copied()
            .filter(|(index, tick)| book.entries[*index].last.is_none_or(|last| last < *tick))
            .collect();
        let mut claimed = Vec::with_capacity(wanted.len());
        while !wanted.is_empty() {
            if !self.session.is_live() {
                return Err(Halt::SessionLost);
            }
            if self.shutdown.is_cancelled() && claimed.is_empty() {
                return Err(Halt::Stopped);
            }
            match self.commit(book, &wanted).await {
                Ok(Some(revision)) => {
                    for (index, tick) in wanted.drain(..) {
                        book.entries[index].revision = revision;
                        book.entries[index].last = Some(tick);
                        claimed.push(index);
                    }
                    break;
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
            let names: Vec<&str> = wanted
                .iter()
                .map(|&(index, _)| book.entries[index].job.name.as_str())
                .collect();
            let seen = self
                .retry(|| ledger::read_claims(self.session, self.keys, &names))
                .await?;
            let mut still_wanted = Vec::new();
            for ((index, tick), seen) in wanted.into_iter().zip(seen) {
                match resolve(&seen, tick, self.leadership.fence, self.node_id) {
                    Resolution::Ours => claimed.push(index),
                    Resolution::TakenByOther => {
                        tracing::info!(job = %book.entries[index].job.name, tick = %tick, "tick already claimed by another leader: not running it here");
                    }
                    Resolution::Open => still_wanted.push((index, tick)),
                }
                book.learn(index, &seen);
            }
            wanted = still_wanted;
        }
        Ok(claimed)
    }

    /// Sends one claim transaction, with earlier runs' results riding along: the claim is a
    /// write etcd makes anyway. `Ok(None)` means a guard failed and nothing was written.
    async fn commit(&self, book: &Book, wanted: &[(usize, DateTime<Utc>)]) -> Result<Option<i64>, CoordError> {
        let requests: Vec<ClaimRequest> = wanted
            .iter()
            .map(|&(index, tick)| ClaimRequest {
                job: book.entries[index].job.name.clone(),
                expected_revision: book.entries[index].revision,
                claim: Claim {
                    scheduled_at: tick,
                    fence: self.leadership.fence,
                    node: self.node_id.to_string(),
                },
            })
            .collect();
        let riders = self.results.take_for(self.leadership.shard, rider_room(requests.len()));
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
        if self.session.is_live() {
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

    fn seen(claim: Option<(i64, i64, &str)>) -> Seen {
        Seen {
            claim: claim.map(|(second, fence, node)| Claim {
                scheduled_at: at(second),
                fence,
                node: node.into(),
            }),
            mod_revision: 9,
        }
    }

    #[test]
    fn a_re_read_record_resolves_each_tick() {
        // Our claim of tick 10 with fence 5 on node "a", resolved against what etcd holds.
        let cases = [
            (None, Resolution::Open, "no record: nobody claimed it"),
            (Some((9, 3, "b")), Resolution::Open, "an older tick: claim again"),
            (Some((10, 5, "a")), Resolution::Ours, "our claim landed"),
            (
                Some((10, 7, "b")),
                Resolution::TakenByOther,
                "another leader claimed this tick",
            ),
            (
                Some((11, 7, "b")),
                Resolution::TakenByOther,
                "another leader moved past it",
            ),
            (
                Some((10, 5, "b")),
                Resolution::TakenByOther,
                "same fence, other node: not ours",
            ),
            (
                Some((10, 4, "a")),
                Resolution::TakenByOther,
                "our node under an older fence: not this term's",
            ),
        ];
        for (record, expected, why) in cases {
            assert_eq!(resolve(&seen(record), at(10), 5, "a"), expected, "{why}");
        }
    }

    #[test]
    fn riders_fill_only_the_room_claims_leave() {
        for (claims, room) in [(0, MAX_OPS_PER_TXN), (1, MAX_OPS_PER_TXN - 1), (MAX_OPS_PER_TXN, 0)] {
            assert_eq!(rider_room(claims), room, "{claims} claims");
        }
    }
}
