//! A term's part in its jobs' backfills: it claims their ticks oldest first, each in a
//! transaction guarded by its leadership (the transaction's revision is the run's fence), while
//! the job is not paused and no live run of it goes on (for `overlap = "skip"` or `"replace"`),
//! and settles the ticks in flight on nodes that went.

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::term::Term;
use super::Backlog;
use crate::clock;
use crate::coord::backfills::{self, Claimed, Settle};
use crate::coord::claims::{Book, Claimer, Halt};
use crate::coord::etcd;
use crate::coord::going;
use crate::rules::backfill::{self, InFlight};
use crate::rules::config::{Job, Overlap};
use crate::rules::protocol::elsewhere::{self, Verdict};
use crate::rules::record::Claim;
use crate::running::runner::{Arrival, BackfillClaim, Tick};

/// How long one look at the backfills may go on starting etcd calls: the firing loop waits for
/// it, so the rest waits for the next look.
const SERVE_BUDGET: Duration = Duration::from_millis(200);

/// The next backfill tick of a job, as its record in etcd says.
enum NextTick {
    /// Claim `Next` of the backfill read at the revision.
    Claim(backfill::Backfill, i64, backfill::Next),
    /// The record was just changed: read it again.
    LookAgain,
    /// Nothing to claim now.
    None(Backlog),
}

impl Term {
    /// Claims and starts the backfill ticks of this shard's jobs that may start now, within
    /// [`SERVE_BUDGET`].
    pub(super) async fn serve_backfills(&self, claimer: &Claimer<'_>, book: &mut Book) -> Result<Backlog, Halt> {
        let until = Instant::now() + SERVE_BUDGET;
        let mut backlog = Backlog::Settled;
        for name in self.mirrors.backfills.with_work(|job| book.index_of(job).is_some()) {
            if Instant::now() >= until {
                return Ok(Backlog::Waits);
            }
            if let Some(index) = book.index_of(&name) {
                // What its record lists beside a backfill run is read before one is claimed.
                claimer.read(book, [index]).await?;
                if self.serve_backfill(book, index, until).await? == Backlog::Waits {
                    backlog = Backlog::Waits;
                }
            }
        }
        Ok(backlog)
    }

    async fn serve_backfill(&self, book: &Book, index: usize, until: Instant) -> Result<Backlog, Halt> {
        let job = Arc::clone(book.job(index));
        if !self.settle_backfill_orphans(&job).await {
            return Ok(Backlog::Waits);
        }
        // The budget bounds the ticks one look claims, not its first: with etcd a few tens of
        // milliseconds away, the reads before a claim alone outlast it, and no tick would ever be
        // claimed.
        let mut claimed_one = false;
        loop {
            let (backfill, revision, next) = match self.next_backfill_tick(&job).await {
                NextTick::Claim(backfill, revision, next) => (backfill, revision, next),
                NextTick::LookAgain => continue,
                NextTick::None(backlog) => return Ok(backlog),
            };
            if (claimed_one && Instant::now() >= until) || self.backfill_waits(book, index).await {
                return Ok(Backlog::Waits);
            }
            match self.claim_backfill_tick(book, index, &backfill, revision, next).await? {
                Some(true) => claimed_one = true,
                Some(false) => {}
                None => return Ok(Backlog::Waits),
            }
        }
    }

    /// Settles the backfill ticks of `job` in flight on nodes that went; false if the record
    /// could not be read. This node's own unheld ticks are an earlier run's; another node's are
    /// orphans once the lease its run is listed on is gone (for records without one, once that
    /// node left the fleet): a node stopping with a shutdown grace leaves the fleet while its
    /// runs go on.
    async fn settle_backfill_orphans(&self, job: &Job) -> bool {
        let (client, keys) = (&self.session.client(), &self.identity.keys);
        let me = self.identity.node_id.as_str();
        let held = &self.mirrors.backfills;
        let members = Arc::clone(&self.fleet.borrow().members);
        let gone = self.gone_leases(&job.name).await;
        let orphaned = |flight: &InFlight| match (flight.node == me, flight.lease) {
            (true, _) => !held.holds(&job.name, flight),
            (false, Some(lease)) => gone.contains(&lease),
            (false, None) => !members.contains_key(&flight.node),
        };
        if let Err(err) = backfills::settle_orphans(client, keys, &job.name, job.delivery, orphaned).await {
            tracing::warn!(job = %job.name, error = %err, "cannot read the job's backfill; trying again shortly");
            return false;
        }
        true
    }

    /// The job's backfill and its next tick to claim, read from etcd.
    async fn next_backfill_tick(&self, job: &Job) -> NextTick {
        let (client, keys) = (&self.session.client(), &self.identity.keys);
        let (backfill, revision) = match backfills::read(client, keys, &job.name).await {
            Ok(Some(read)) => read,
            Ok(None) => return NextTick::None(Backlog::Settled),
            Err(err) => {
                tracing::warn!(job = %job.name, error = %err, "cannot read the job's backfill; trying again shortly");
                return NextTick::None(Backlog::Waits);
            }
        };
        if let Some(next) = backfill.next_claim(job) {
            return NextTick::Claim(backfill, revision, next);
        }
        // None while `parallel` are in flight: the ends of those on this node change the
        // record; another node's may be an orphan once the fleet sees that node gone.
        if backfill.clone().ran_out(job) && !backfill.cancelled {
            tracing::warn!(job = %job.name, backfill = %backfill.id, claimed = backfill.claimed, total = backfill.total, "the job's schedule has fewer ticks in the backfill's range than when it was asked for (a reload changed it): the backfill ends with those it has");
            if let Err(err) = backfills::update(client, keys, &job.name, Some(&backfill.id), |record| {
                record.ran_out(job)
            })
            .await
            {
                tracing::warn!(job = %job.name, error = %err, "cannot write the backfill's new total; trying again shortly");
                return NextTick::None(Backlog::Waits);
            }
            return NextTick::LookAgain;
        }
        let me = self.identity.node_id.as_str();
        let elsewhere = backfill.in_flight.iter().any(|flight| flight.node != me);
        NextTick::None(if elsewhere { Backlog::Waits } else { Backlog::Settled })
    }

    /// Whether the job's next backfill tick waits: the job is paused, a live run of it goes or
    /// waits here, this leadership owes it ticks, or runs listed beside it go on.
    async fn backfill_waits(&self, book: &Book, index: usize) -> bool {
        let job = book.job(index);
        let now = clock::now();
        self.mirrors.pauses.stopping(job.job_name(), now, now).is_some()
            || !self.work.runs.idle_for_backfill(&job.name, job.overlap)
            // Ticks this leadership owes (adopted at a takeover, claimed ahead) start
            // first: a backfill claimed now would start before them with a higher fence.
            || (job.overlap != Overlap::Allow && !self.starts.owed(&job.name).is_empty())
            || self.beside_listed_runs(job, book.entries()[index].record()).await
    }

    /// Claims `next` of `backfill` (read at `revision`) and starts its run: `Some(true)` once
    /// started, `Some(false)` if the record changed meanwhile (read it again), `None` if the tick
    /// waits (no lease to list the run on, or the claim's answer was lost).
    async fn claim_backfill_tick(
        &self,
        book: &Book,
        index: usize,
        backfill: &backfill::Backfill,
        revision: i64,
        next: backfill::Next,
    ) -> Result<Option<bool>, Halt> {
        let job = book.job(index);
        let (client, keys) = (&self.session.client(), &self.identity.keys);
        let held = &self.mirrors.backfills;
        // The run is listed on the node's slot lease, which the claim names: without one
        // (being reopened after an outage), the claim waits for it.
        let Some(lease) = self.mirrors.groups.lease_now() else {
            return Ok(None);
        };
        let claim = backfill::new_id();
        let mut claimed = backfill.clone();
        claimed.claim(
            next,
            &self.identity.node_id,
            self.leadership.term,
            &claim,
            Some(lease.lease()),
        );
        held.hold(&job.name, next.tick, &claim);
        let answer = backfills::claim(client, keys, &self.leadership, &job.name, revision, &claimed).await;
        match answer {
            Ok(Claimed::Ours(fence)) => {
                let (done, total) = backfill.progress();
                tracing::info!(job = %job.name, backfill = %backfill.id, tick = %crate::clock::rfc3339(next.tick), fence, done, total, redelivered = next.redelivered, "starting a backfill run");
                let arrival = Arrival::Backfill {
                    claim: BackfillClaim {
                        backfill: backfill.id.clone(),
                        claim,
                    },
                    redelivered: next.redelivered,
                };
                self.work.runs.start(vec![Tick {
                    elsewhere: Vec::new(),
                    claimed_elsewhere: Vec::new(),
                    ..self.tick(book, index, next.tick, fence, arrival)
                }]);
                Ok(Some(true))
            }
            Ok(Claimed::Changed) => {
                held.release(&job.name, next.tick, &claim);
                Ok(Some(false))
            }
            Ok(Claimed::Deposed) => {
                held.release(&job.name, next.tick, &claim);
                Err(Halt::Deposed)
            }
            Err(err) => {
                // The claim may have landed: its tick goes back if it did, off the firing
                // loop, held until then so no orphan check takes it for an earlier run's.
                tracing::warn!(job = %job.name, error = %err, "a backfill claim's answer was lost; giving its tick back if it landed");
                let (client, keys, held) = (client.clone(), keys.clone(), Arc::clone(held));
                let (name, id) = (job.name.clone(), backfill.id.clone());
                tokio::spawn(async move {
                    backfills::settle_tick(&client, &keys, &name, &id, next.tick, &claim, Settle::Again).await;
                    held.release(&name, next.tick, &claim);
                });
                Ok(None)
            }
        }
    }

    /// The leases of other nodes' backfill ticks of `job` in flight that etcd says are gone;
    /// one etcd cannot answer for counts as held.
    async fn gone_leases(&self, job: &str) -> HashSet<i64> {
        let mut gone = HashSet::new();
        let leases: BTreeSet<i64> = self
            .mirrors
            .backfills
            .in_flight_elsewhere(job, &self.identity.node_id)
            .iter()
            .filter_map(|flight| flight.lease)
            .collect();
        for lease in leases {
            if etcd::lease_gone(&self.session.client(), lease).await.unwrap_or(false) {
                gone.insert(lease);
            }
        }
        gone
    }

    /// Whether runs of `job` that its record lists going on other nodes, or ticks other leaders
    /// claimed, keep its backfill waiting: those etcd shows ended (their end recorded, or their node's lease gone) are
    /// marked seen ended, the rest wait. Nothing is asked of their nodes: a backfill waits.
    async fn beside_listed_runs(&self, job: &Job, record: Option<&Claim>) -> bool {
        // Ticks another leader claimed (the other shard count's, while a change of `shards`
        // rolls) may have started unlisted: the backfill waits for that leader's next write.
        let mut waiting = !self.claimed_elsewhere(job, record).is_empty();
        for run in self.elsewhere(job, record) {
            match going::look(&self.session.client(), &self.identity.keys, &job.name, &run).await {
                Some(shown) if matches!(elsewhere::verdict(&shown), Verdict::Ended) => {
                    self.starts.here().ended_elsewhere(&job.name, &run);
                }
                _ => waiting = true,
            }
        }
        waiting
    }
}
