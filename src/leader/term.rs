//! One leadership of one shard: what a term is, how it ends its leadership, and the claims and
//! runs it makes for an instant or a request. The firing loop is in `fire`.

use std::cmp::Reverse;
use std::collections::VecDeque;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::fire::Queue;
use super::{TermEnd, WonTicks, SPAWNS_SETTLE};
use crate::clock;
use crate::context::{Identity, Mirrors, Work};
use crate::coord::claims::{Book, Claimer, Halt};
use crate::coord::election::Leadership;
use crate::coord::session::Session;
use crate::coord::starts::Starts;
use crate::coord::triggers::{self, Taken};
use crate::coord::view::FleetView;
use crate::rules::config::Loaded;
use crate::rules::config::{Job, Overlap};
use crate::rules::protocol::elsewhere::{self, ClaimedTick};
use crate::rules::protocol::Want;
use crate::rules::record::{Claim, Going};
use crate::running::runner::{Arrival, Tick};

/// One leadership of one shard.
pub(super) struct Term {
    pub(super) identity: Arc<Identity>,
    pub(super) mirrors: Arc<Mirrors>,
    pub(super) work: Arc<Work>,
    /// The root of the cancellation tree: signals cancel it.
    pub(super) shutdown: CancellationToken,
    pub(super) session: Session,
    pub(super) fleet: watch::Receiver<FleetView>,
    pub(super) leadership: Leadership,
    /// The ticks this leadership owes; its token ends with the leadership (not at a reload).
    pub(super) starts: Arc<Starts>,
}

impl Term {
    /// Leads the shard with `jobs` until shutdown, the session's loss, deposition, a handoff or
    /// a reload of the node's jobs, starting from what `known` knew of them.
    pub(super) async fn lead(
        &self,
        jobs: Vec<Arc<Job>>,
        known: Book,
        reloads: watch::Receiver<Arc<Loaded>>,
    ) -> TermEnd {
        let mut fleet = self.fleet.clone();
        if self.should_hand_over(&mut fleet) {
            return TermEnd::HandedOff;
        }
        let claimer = self.claimer();
        let mut book = Book::open(jobs, known);
        let end = self.fire(&claimer, &mut book, fleet, reloads).await;
        if matches!(end, TermEnd::HandedOff | TermEnd::Stopped) {
            // Nothing this leadership owes starts from here on; the starts it made are written
            // before the lease is revoked or the shard resigned, so the next leader delivers
            // exactly the claimed ticks that never started.
            self.starts.leading().cancel();
            let settled = tokio::time::timeout(SPAWNS_SETTLE, self.starts.spawns_settled())
                .await
                .is_ok();
            let last_write = if settled {
                claimer.release(&mut book).await
            } else {
                tracing::warn!("runs still spawning after the leadership ended: the next leader may run them again");
                claimer.claim(&mut book, &[]).await.map(drop)
            };
            if let Err(halt) = last_write {
                tracing::warn!(reason = ?halt, "could not write the last starts: the next leader runs those ticks again");
            }
        }
        end
    }

    /// Each of `jobs`' next tick after `now`, a tick this leadership claimed ahead and owes
    /// first.
    pub(super) fn queue(&self, book: &Book, jobs: &[usize], now: DateTime<Utc>) -> Queue {
        jobs.iter()
            .filter_map(|&index| {
                let entry = &book.entries()[index];
                let owed = self.starts.next_owed_after(&entry.job.name, now);
                let from = entry.last().map_or(now, |last| last.max(now));
                owed.or_else(|| entry.job.schedule.next_after(from))
                    .map(|next| Reverse((next, index)))
            })
            .collect()
    }

    /// How long before a tick it is claimed, or confirmed if it was claimed ahead.
    pub(super) fn claim_lead(&self) -> chrono::Duration {
        chrono::Duration::from_std(self.work.claim_lead.lead()).unwrap_or_default()
    }

    /// Claims every job due at `due` that this leadership does not owe yet, takes them off the
    /// queue with their next ticks queued, and returns the jobs whose tick is theirs to fire,
    /// each with its fence.
    pub(super) async fn claim_instant(
        &self,
        claimer: &Claimer<'_>,
        book: &mut Book,
        queue: &mut Queue,
        due: DateTime<Utc>,
    ) -> Result<WonTicks, Halt> {
        let mut due_now = Vec::new();
        while let Some(&Reverse((next, index))) = queue.peek() {
            if next != due {
                break;
            }
            queue.pop();
            due_now.push(index);
        }
        let mut owed = Vec::new();
        let mut wants = Vec::new();
        for &index in &due_now {
            match self.starts.owed_fence(&book.job(index).name, due) {
                Some(fence) => owed.push((index, fence)),
                None => wants.push(Want::tick(index, due)),
            }
        }
        let won = claimer.claim(book, &wants).await?;
        for won in &won {
            // Ticks before `due` won too: the record had moved less far than the queue (a leader
            // of the other shard count claimed past them while this claim of them was late).
            // Past due, they start now, caught up.
            let late: Vec<Tick> = won
                .fresh
                .iter()
                .filter(|tick| **tick < due)
                .map(|tick| self.tick(book, won.index, *tick, won.fence, Arrival::CaughtUp))
                .collect();
            if !late.is_empty() {
                self.work.runs.start(late);
            }
        }
        let ahead_ms = (due - clock::now()).num_microseconds().unwrap_or_default() as f64 / 1000.0;
        tracing::debug!(tick = %clock::rfc3339(due), jobs = won.len(), ahead_ms, "claimed");
        for index in due_now {
            if let Some(next) = book.job(index).schedule.next_after(due) {
                queue.push(Reverse((next, index)));
            }
        }
        Ok(owed
            .into_iter()
            .chain(won.iter().map(|won| (won.index, won.fence)))
            .collect())
    }

    pub(super) fn claimer(&self) -> Claimer<'_> {
        Claimer {
            session: &self.session,
            keys: &self.identity.keys,
            leadership: &self.leadership,
            node_id: &self.identity.node_id,
            starts: &self.starts,
            results: &self.work.results,
            lead: &self.work.claim_lead,
            shutdown: &self.shutdown,
            releasing: false,
        }
    }

    /// Why the session's token was cancelled: a shutdown, or the session's end.
    pub(super) fn cancelled(&self) -> TermEnd {
        if self.shutdown.is_cancelled() {
            TermEnd::Stopped
        } else {
            TermEnd::SessionLost
        }
    }

    /// A tick of the job at `index` of `book` to start, won with `fence`.
    pub(super) fn tick(
        &self,
        book: &Book,
        index: usize,
        scheduled_at: DateTime<Utc>,
        fence: i64,
        arrival: Arrival,
    ) -> Tick {
        let entry = &book.entries()[index];
        let job = &entry.job;
        Tick {
            job: Arc::clone(job),
            scheduled_at,
            fence,
            term: self.leadership.term,
            node: self.identity.node_id.clone(),
            starts: Arc::clone(&self.starts),
            arrival,
            elsewhere: self.elsewhere(job, entry.record()),
            claimed_elsewhere: self.claimed_elsewhere(job, entry.record()),
        }
    }

    /// The ticks of `job` other leaderships claimed as `record` lists them; none for a job
    /// whose runs may overlap, or that runs only here.
    pub(super) fn claimed_elsewhere(&self, job: &Job, record: Option<&Claim>) -> Vec<ClaimedTick> {
        if job.overlap == Overlap::Allow || job.instance_of.is_some() {
            return Vec::new();
        }
        record.map_or_else(Vec::new, |record| {
            elsewhere::beside(record, &self.identity.node_id, self.leadership.term).claimed
        })
    }

    /// The runs of `job` going on other nodes that `record` lists and this node has not seen
    /// end; none for a job whose runs may overlap, or that runs only here.
    pub(super) fn elsewhere(&self, job: &Job, record: Option<&Claim>) -> Vec<Going> {
        if job.overlap == Overlap::Allow || job.instance_of.is_some() {
            return Vec::new();
        }
        let here = self.starts.here();
        record
            .into_iter()
            .flat_map(|claim| &claim.going)
            .filter(|run| run.node != self.identity.node_id && !here.seen_ended(&job.name, run))
            .cloned()
            .collect()
    }

    /// Claims the runs asked for by hand of this shard's jobs and starts those it won. Each
    /// takes one transaction: requests are rare, and each must be answered on its own.
    pub(super) async fn serve_requests(&self, claimer: &Claimer<'_>, book: &mut Book) -> Result<(), Halt> {
        let mut requests: VecDeque<_> = self
            .mirrors
            .triggers
            .take_for(|job| book.index_of(job).is_some())
            .into();
        while let Some(request) = requests.pop_front() {
            let Some(index) = book.index_of(&request.job) else {
                continue;
            };
            // What its record lists beside the run (runs going, ticks claimed) is read before
            // the run is claimed: a new leader reads its jobs' records as it first needs them.
            if let Err(halt) = claimer.read(book, [index]).await {
                requests.push_front(request);
                self.mirrors.triggers.put_back(requests);
                return Err(halt);
            }
            let job = book.job(index);
            let claimed = claimer
                .retry(|| {
                    triggers::claim(
                        &self.session,
                        &self.identity.keys,
                        &self.leadership,
                        &self.identity.node_id,
                        &request,
                    )
                })
                .await;
            let taken = match claimed {
                Ok(taken) => taken,
                Err(halt) => {
                    // Still in etcd: this node serves them if it leads again.
                    requests.push_front(request);
                    self.mirrors.triggers.put_back(requests);
                    return Err(halt);
                }
            };
            match taken {
                Taken::Ours(fence) => {
                    tracing::info!(job = %job.name, request = %request.id, fence, "starting a run asked for by hand");
                    crate::metrics::get()
                        .triggered_runs
                        .get_or_create(&crate::metrics::JobLabel::new(job.job_name()))
                        .inc();
                    let arrival = Arrival::Manual(request.id.clone());
                    self.work
                        .runs
                        .start(vec![self.tick(book, index, request.requested_at, fence, arrival)]);
                }
                Taken::Gone => {
                    tracing::info!(job = %job.name, request = %request.id, "a run asked for by hand was withdrawn or taken by another leader")
                }
                Taken::Deposed => {
                    requests.push_front(request);
                    self.mirrors.triggers.put_back(requests);
                    return Err(Halt::Deposed);
                }
            }
        }
        Ok(())
    }

    pub(super) fn should_hand_over(&self, fleet: &mut watch::Receiver<FleetView>) -> bool {
        let hand_over = fleet
            .borrow_and_update()
            .should_hand_over(self.leadership.shard, &self.identity.node_id);
        if hand_over {
            tracing::info!("handing the shard to its target node, which is campaigning for it");
        }
        hand_over
    }
}
