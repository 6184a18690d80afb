//! One shard of one node: campaign, lead in terms, resign; and the firing loop of a term.
//!
//! A term keeps a time-ordered queue of its jobs' next ticks. For each instant it sleeps until
//! a little before it, claims every job due then (see [`crate::claims`]), sleeps to the instant
//! by the wall clock and starts the runs. It never fires early, and it never starts a run once
//! its lease may have expired, so a stalled leader that wakes up late does nothing.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::backoff::{sleep_or_cancel, Backoff};
use crate::catch_up::{missed_ticks, MAX_CATCH_UP};
use crate::claims::{self, Book, Claimer, Halt};
use crate::clock;
use crate::config::Job;
use crate::context::{Loaded, NodeContext};
use crate::election::{self, Leadership};
use crate::fleet::FleetView;
use crate::runner::Tick;
use crate::session::Session;

/// Why a term ended; the shard task decides what comes next.
#[derive(Debug)]
enum TermEnd {
    /// Shutdown: stop campaigning.
    Stopped,
    /// The node's lease is gone or may be: every term of the node ends.
    SessionLost,
    /// Another candidate leads now: campaign again.
    Deposed,
    /// This node is not the shard's target and the target is campaigning: resign, stand by.
    HandedOff,
    /// `jobs.toml` was reloaded: lead on, with the new jobs, under the same leadership, from
    /// what this term knew of the jobs it keeps.
    JobsReloaded(Book),
}

impl From<Halt> for TermEnd {
    fn from(halt: Halt) -> TermEnd {
        match halt {
            Halt::Stopped => TermEnd::Stopped,
            Halt::SessionLost => TermEnd::SessionLost,
            Halt::Deposed => TermEnd::Deposed,
        }
    }
}

/// Campaigns for `shard` and leads it whenever elected, until the session ends.
pub(crate) async fn run_shard(node: Arc<NodeContext>, session: Session, fleet: watch::Receiver<FleetView>, shard: u32) {
    let mut jobs = node.jobs.clone();
    let mut backoff = Backoff::coordination();
    loop {
        let campaign = tokio::select! {
            result = election::campaign(&session, &node.keys, node.shards, shard, &node.node_id) => result,
            _ = session.ended().cancelled() => return,
        };
        let leadership = match campaign {
            Ok(leadership) => leadership,
            Err(err) => {
                let wait = backoff.next_delay();
                tracing::warn!(shard, error = %err, retry_in = ?wait, "campaign failed; retrying");
                if !sleep_or_cancel(wait, session.ended()).await {
                    return;
                }
                continue;
            }
        };
        backoff.reset();
        // One leadership may span several terms: a reload ends a term between ticks and the
        // next one leads on with the new jobs, without resigning. Runs keep retrying for as
        // long as the leadership lasts.
        let term = Term {
            node: Arc::clone(&node),
            session: session.clone(),
            fleet: fleet.clone(),
            leading: session.ended().child_token(),
            leadership,
        };
        let _leading = term.leading.clone().drop_guard();
        let mut known = Some(Book::default());
        while let Some(book) = known.take() {
            let shard_jobs = jobs.borrow_and_update().by_shard[shard as usize].clone();
            tracing::info!(
                shard,
                fence = term.leadership.fence,
                jobs = shard_jobs.len(),
                "leading shard"
            );
            let shards_led = &crate::metrics::get().shards_led;
            shards_led.inc();
            let end = term.lead(shard_jobs, book, jobs.clone()).await;
            shards_led.dec();
            tracing::info!(shard, fence = term.leadership.fence, reason = ?end, "term ended");
            match end {
                TermEnd::JobsReloaded(book) => known = Some(book),
                TermEnd::Deposed => {}
                TermEnd::HandedOff => {
                    if let Err(err) = election::resign(&session, &term.leadership).await {
                        tracing::warn!(shard, error = %err, "could not resign; the claims still keep each tick once");
                    }
                }
                TermEnd::Stopped | TermEnd::SessionLost => return,
            }
        }
    }
}

/// One leadership of one shard.
struct Term {
    node: Arc<NodeContext>,
    session: Session,
    fleet: watch::Receiver<FleetView>,
    leadership: Leadership,
    /// A child of the session's token, cancelled when this leadership ends (not at a reload):
    /// runs it started retry no more.
    leading: CancellationToken,
}

impl Term {
    /// Leads the shard with `jobs` until shutdown, the session's loss, deposition, a handoff or
    /// a reload of the node's jobs, starting from what `known` knew of them.
    async fn lead(&self, jobs: Vec<Arc<Job>>, known: Book, mut reloads: watch::Receiver<Arc<Loaded>>) -> TermEnd {
        let mut fleet = self.fleet.clone();
        if self.should_hand_over(&mut fleet) {
            return TermEnd::HandedOff;
        }
        let claimer = self.claimer();
        let mut book = match claimer.open_book(jobs, known).await {
            Ok(book) => book,
            Err(halt) => return halt.into(),
        };
        if let Err(halt) = self.catch_up(&claimer, &mut book).await {
            return halt.into();
        }

        let now = clock::now();
        let mut queue: BinaryHeap<Reverse<(DateTime<Utc>, usize)>> = book
            .entries()
            .iter()
            .enumerate()
            .filter_map(|(index, entry)| {
                let from = entry.last.map_or(now, |last| last.max(now));
                entry.job.schedule.next_after(from).map(|next| Reverse((next, index)))
            })
            .collect();

        loop {
            let claim_at = queue.peek().map(|Reverse((due, _))| {
                *due - chrono::Duration::from_std(self.node.claim_lead.lead()).unwrap_or_default()
            });
            let wake = async {
                match claim_at {
                    Some(at) => clock::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            // Between ticks is the quiet moment: no claim is in flight, so a handoff here
            // neither loses nor doubles a tick.
            tokio::select! {
                _ = wake => {}
                changed = fleet.changed() => {
                    if changed.is_err() {
                        // The view only closes when the session ends or the node stops.
                        self.session.ended().cancelled().await;
                        return self.cancelled();
                    }
                    if self.should_hand_over(&mut fleet) {
                        return TermEnd::HandedOff;
                    }
                    continue;
                }
                Ok(()) = reloads.changed() => return TermEnd::JobsReloaded(book),
                _ = self.session.ended().cancelled() => return self.cancelled(),
            }
            let Some(&Reverse((due, _))) = queue.peek() else {
                continue;
            };
            let mut due_now = Vec::new();
            while let Some(&Reverse((next, index))) = queue.peek() {
                if next != due {
                    break;
                }
                queue.pop();
                due_now.push(index);
            }
            let wanted: Vec<(usize, DateTime<Utc>)> = due_now.iter().map(|&index| (index, due)).collect();
            let claimed = match claimer.claim(&mut book, &wanted).await {
                Ok(claimed) => claimed,
                Err(halt) => return halt.into(),
            };
            let ahead_ms = (due - clock::now()).num_microseconds().unwrap_or_default() as f64 / 1000.0;
            tracing::debug!(shard = self.leadership.shard, tick = %due, jobs = claimed.len(), ahead_ms, "claimed");
            clock::sleep_until(due).await;
            if !self.session.is_live() {
                tracing::error!(shard = self.leadership.shard, tick = %due, "the lease may have expired before the tick: not starting its claimed runs");
                return TermEnd::SessionLost;
            }
            let lateness = (clock::now() - due).to_std().unwrap_or_default();
            for index in &claimed {
                crate::metrics::get().lateness.observe(lateness.as_secs_f64());
                self.node.runs.start(vec![self.tick(book.job(*index), due, false)]);
            }
            for index in due_now {
                if let Some(next) = book.job(index).schedule.next_after(due) {
                    queue.push(Reverse((next, index)));
                }
            }
        }
    }

    fn claimer(&self) -> Claimer<'_> {
        Claimer {
            session: &self.session,
            keys: &self.node.keys,
            leadership: &self.leadership,
            node_id: &self.node.node_id,
            results: &self.node.results,
            lead: &self.node.claim_lead,
            shutdown: &self.node.shutdown,
        }
    }

    /// Why the session's token was cancelled: a shutdown, or the session's end.
    fn cancelled(&self) -> TermEnd {
        if self.node.shutdown.is_cancelled() {
            TermEnd::Stopped
        } else {
            TermEnd::SessionLost
        }
    }

    fn tick(&self, job: &Arc<Job>, scheduled_at: DateTime<Utc>, caught_up: bool) -> Tick {
        Tick {
            job: Arc::clone(job),
            scheduled_at,
            fence: self.leadership.fence,
            node: self.node.node_id.clone(),
            leading: self.leading.clone(),
            caught_up,
        }
    }

    fn should_hand_over(&self, fleet: &mut watch::Receiver<FleetView>) -> bool {
        let hand_over =
            fleet
                .borrow_and_update()
                .should_hand_over(self.node.shards, self.leadership.shard, &self.node.node_id);
        if hand_over {
            tracing::info!(
                shard = self.leadership.shard,
                fence = self.leadership.fence,
                "handing the shard to its target node, which is campaigning for it"
            );
        }
        hand_over
    }

    /// Runs the ticks missed while the shard had no leader, as each job's policy says.
    async fn catch_up(&self, claimer: &Claimer<'_>, book: &mut Book) -> Result<(), Halt> {
        let now = clock::now();
        let mut pending: Vec<(usize, Vec<DateTime<Utc>>)> = Vec::new();
        for (index, entry) in book.entries().iter().enumerate() {
            let missed = missed_ticks(&entry.job, entry.last, now);
            if missed.truncated {
                tracing::warn!(job = %entry.job.name, kept = MAX_CATCH_UP, "more ticks were missed than one takeover catches up: running only the newest");
            }
            if !missed.ticks.is_empty() {
                pending.push((index, missed.ticks));
            }
        }
        // A chunk's runs start as soon as it is claimed, before the next chunk's claim.
        for chunk in claims::batches(&pending) {
            let newest: Vec<(usize, DateTime<Utc>)> = chunk
                .iter()
                .filter_map(|(index, ticks)| ticks.last().map(|tick| (*index, *tick)))
                .collect();
            let claimed = claimer.claim(book, &newest).await?;
            for (index, ticks) in chunk.iter().filter(|(index, _)| claimed.contains(index)) {
                let job = book.job(*index);
                tracing::info!(job = %job.name, ticks = ticks.len(), first = %ticks[0], policy = ?job.catch_up, "catching up missed ticks");
                crate::metrics::get().catch_up_runs.inc_by(ticks.len() as u64);
                self.node
                    .runs
                    .start(ticks.iter().map(|tick| self.tick(job, *tick, true)).collect());
            }
        }
        Ok(())
    }
}
