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

mod book;
mod lead;
mod reread;
mod retry;

use tokio_util::sync::CancellationToken;

pub(crate) use book::Book;
pub(crate) use lead::ClaimLead;

use crate::coord::election::{self, Leadership};
use crate::coord::etcd::ops_per_txn;
use crate::coord::etcd::CoordError;
use crate::coord::history;
use crate::coord::keys::Keys;
use crate::coord::ledger::{self, ClaimRequest};
use crate::coord::results::ResultQueue;
use crate::coord::session::Session;
use crate::coord::starts::Starts;
use crate::rules::protocol::{going_after, next_record, Want, Won, Writer};
use crate::rules::record::{Claim, RunRecord};

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

/// `items` in groups of at most as many as one claim transaction takes.
fn batches<T>(items: &[T]) -> std::slice::Chunks<'_, T> {
    items.chunks(ops_per_txn())
}

/// How many more operations fit in a claim that already has `used`.
fn room(used: usize) -> usize {
    ops_per_txn().saturating_sub(used)
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
    /// The leadership has ended with every spawn settled: its writes mark what it still lists
    /// as released ([`Claim::released`]).
    pub(crate) releasing: bool,
}

impl Claimer<'_> {
    /// Reads the records of those of `indices` this leadership has not read yet.
    pub(crate) async fn read(&self, book: &mut Book, indices: impl IntoIterator<Item = usize>) -> Result<(), Halt> {
        let unread = book.unread(indices);
        if unread.is_empty() {
            return Ok(());
        }
        let names: Vec<&str> = unread
            .iter()
            .map(|index| book.entries[*index].job.name.as_str())
            .collect();
        let seen = self
            .retry(|| ledger::read_claims(self.session, self.keys, &names))
            .await?;
        for (index, seen) in unread.into_iter().zip(seen) {
            book.learn(index, &seen);
        }
        Ok(())
    }

    /// Writes each of `wants`, in transactions of at most [`ops_per_txn`] records, with the
    /// starts not yet written riding along, and returns the ticks won. With no wants it writes
    /// only the starts. After a shutdown it claims nothing new and only writes starts and
    /// takeovers.
    pub(crate) async fn claim(&self, book: &mut Book, wants: &[Want]) -> Result<Vec<Won>, Halt> {
        if wants.is_empty() {
            // Starts of more jobs than one transaction takes (a stop's last write after an
            // instant of hundreds of jobs) take several, oldest first. Only those made before
            // this write: a backlog's runs may start faster than they are written, and the
            // firing loop waits for this write.
            let began = std::time::Instant::now();
            while self.starts.oldest_unrecorded().is_some_and(|since| since <= began) {
                self.claim_chunk(book, Vec::new()).await?;
            }
            return Ok(Vec::new());
        }
        let mut won = Vec::with_capacity(wants.len());
        for chunk in batches(wants) {
            won.extend(self.claim_chunk(book, chunk.to_vec()).await?);
        }
        Ok(won)
    }

    /// One guarded transaction for at most [`ops_per_txn`] records, repeated after a
    /// rejection or an unknown outcome until every want is settled.
    async fn claim_chunk(&self, book: &mut Book, mut wants: Vec<Want>) -> Result<Vec<Won>, Halt> {
        // A claim is guarded by the revision it read: a job asked for (a manual run) before the
        // takeover reached it is read first.
        self.read(book, wants.iter().map(|want| want.index)).await?;
        for want in &mut wants {
            want.keep_after(book.entries[want.index].last());
        }
        wants.retain(Want::asks_anything);
        let mut won = Vec::with_capacity(wants.len());
        let mut riding_starts = Vec::new();
        let result = self.settle(book, &mut wants, &mut won, &mut riding_starts).await;
        if result.is_err() {
            self.starts.unrecord(riding_starts);
        }
        result.map(|()| won)
    }

    /// Writes `wants` until each is settled: won, found claimed by another leader, or given up
    /// at a halt. The starts not yet written ride along, in `riding_starts` until they land.
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
            self.take_riding_starts(book, wants, riding_starts);
            if wants.is_empty() {
                return Ok(());
            }
            if !self.session.check_live() {
                return Err(Halt::SessionLost);
            }
            let intended = self.intended(book, wants);
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
                    tracing::warn!("claim rejected by etcd: re-checking leadership");
                    match election::still_leads(self.session, self.leadership).await {
                        Ok(true) => {}
                        Ok(false) => return Err(Halt::Deposed),
                        Err(err) => self.pause_after(&err).await?,
                    }
                }
                Err(err) => self.pause_after(&err).await?,
            }
            *wants = self.read_outcome(book, wants, intended, won, riding_starts).await?;
        }
    }

    /// Adds to `wants` the jobs whose starts are not written yet, as many as the transaction
    /// has room for, oldest first.
    fn take_riding_starts(
        &self,
        book: &Book,
        wants: &mut Vec<Want>,
        riding_starts: &mut Vec<(String, std::time::Instant)>,
    ) {
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
                // A job no leader ever claimed (its asked runs read its record first), or one a
                // reload removed (its pending ticks go to whoever leads it next): no record to
                // list its runs in, nor anything claimed beside them.
                _ => self.starts.here().no_record(&job),
            }
        }
    }

    /// The record each of `wants` writes.
    fn intended(&self, book: &Book, wants: &[Want]) -> Vec<Option<Claim>> {
        wants
            .iter()
            .map(|want| {
                let entry = &book.entries[want.index];
                let writer = Writer {
                    term: self.leadership.term,
                    node: self.node_id,
                    pool: self.leadership.pool.as_deref(),
                    shards: self.leadership.shards,
                    releasing: self.releasing && self.starts.releasable(&entry.job.name),
                };
                let owed = self.starts.owed(&entry.job.name);
                let mut record = next_record(
                    entry.record.as_deref(),
                    want,
                    &owed,
                    &writer,
                    entry.job.schedule.label(),
                );
                if let Some(record) = &mut record {
                    let here = self.starts.here();
                    let job = &entry.job.name;
                    record.going = going_after(entry.record.as_deref(), here.own_going(job), self.node_id, |run| {
                        here.seen_ended(job, run)
                    });
                }
                record
            })
            .collect()
    }

    /// Books a write that landed: the record is `intended` at `revision`, and its new and
    /// adopted ticks are owed.
    fn won(&self, book: &mut Book, want: Want, intended: Option<Claim>, revision: i64, won: &mut Vec<Won>) {
        if let Some(written) = &intended {
            let (here, job) = (self.starts.here(), &book.entries[want.index].job.name);
            here.written(job, &written.listed());
            here.record_written(job, written, self.node_id, self.leadership.term);
        }
        book.holds(want.index, revision, intended);
        let entry = &book.entries[want.index];
        self.starts
            .owe(&entry.job.name, want.fresh.iter().chain(&want.adopt).copied(), revision);
        if !want.starts_only {
            won.push(Won {
                index: want.index,
                fresh: want.fresh,
                adopt: want.adopt,
                settles: want.settles,
                fence: revision,
            });
        }
    }

    /// The last write of a leadership that has ended with every spawn settled: the starts not
    /// written yet, and the record of every job it still owes ticks of, marked released, so
    /// its successor runs them as never started whatever its clock says.
    pub(crate) async fn release(&self, book: &mut Book) -> Result<(), Halt> {
        let releasing = Claimer {
            releasing: true,
            ..*self
        };
        // Every job it owes ticks of, and every job this node runs a listed run of: a run that
        // goes on past the leadership (under a shutdown grace, after a handoff) stays listed for
        // the successor, whatever kind of run it is.
        let mut jobs = self.starts.owing_jobs();
        jobs.extend(self.starts.here().jobs_going());
        jobs.sort();
        jobs.dedup();
        let owing: Vec<Want> = jobs
            .iter()
            .filter_map(|job| book.index_of(job))
            .map(Want::starts_only)
            .collect();
        for chunk in batches(&owing) {
            releasing.claim_chunk(book, chunk.to_vec()).await?;
        }
        releasing.claim(book, &[]).await.map(drop)
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
        let carried: Vec<(&str, &RunRecord, Option<&RunRecord>)> = riders
            .iter()
            .map(|rider| (rider.job.as_str(), &rider.record, rider.unwritten_success()))
            .collect();
        let rider_ops: usize = riders
            .iter()
            .map(|rider| ledger::result_op_count(&rider.record, rider.unwritten_success()))
            .sum();
        let history_room = room(requests.len() + rider_ops) / history::OPS_PER_ENTRY;
        let entries = self.results.history.take_for(self.leadership.shard, history_room);
        let sent = std::time::Instant::now();
        let outcome = ledger::claim(self.session, self.keys, self.leadership, &requests, &carried, &entries).await;
        self.lead.observe(sent.elapsed());
        let written = matches!(outcome, Ok(Some(_)));
        self.results.settle(riders, written);
        if !written {
            self.results.history.put_back(entries);
        }
        outcome
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_and_results_fill_only_the_room_claims_leave() {
        for (used, left) in [
            (0, ops_per_txn()),
            (1, ops_per_txn() - 1),
            (ops_per_txn(), 0),
            (ops_per_txn() + 1, 0),
        ] {
            assert_eq!(room(used), left, "{used} used");
        }
    }
}
