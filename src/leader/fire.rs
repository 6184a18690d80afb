//! A term's firing loop: between instants it waits for the next wake or event, then claims the
//! next instant (or confirms one claimed ahead), sleeps to it by the wall clock and starts its
//! runs. When to wake is decided by [`super::wake`].

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap, VecDeque};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use tokio::sync::watch;
use tokio_util::task::AbortOnDropHandle;

use super::wake::{self, Known};
use super::{read_successes, Backlog, Term, TermEnd, WonTicks};
use crate::clock;
use crate::coord::claims::{Book, Claimer};
use crate::coord::results::RIDE_WINDOW;
use crate::coord::view::FleetView;
use crate::rules::catch_up::MAX_OWED;
use crate::rules::config::Delivery;
use crate::rules::config::Loaded;
use crate::rules::protocol::counts_gone;
use crate::running::runner::Arrival;

/// How late an instant may be before the firing loop takes it for a forward step of the wall
/// clock, or a stall, and catches up what passed instead of firing it: more than an etcd
/// election or a loaded machine delays a claim.
const OVERDUE_LIMIT: chrono::Duration = chrono::Duration::seconds(2);

/// How soon a term looks again at backfill ticks that wait for a pause or a live run to end.
const BACKFILL_LOOK: std::time::Duration = std::time::Duration::from_secs(1);

async fn sleep_until_some(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The next tick of each job, earliest first.
pub(super) type Queue = BinaryHeap<Reverse<(DateTime<Utc>, usize)>>;

/// What the firing loop carries from one wake to the next.
struct Firing {
    queue: Queue,
    /// Jobs whose earlier leaders' ticks and missed ticks are not settled yet, front first.
    behind: VecDeque<usize>,
    /// Jobs whose backlog is longer than they may owe at once: the rest is claimed in parts.
    refilling: Vec<usize>,
    /// Where the jobs of `behind` stopped being missed: what is due after it, this leader owes.
    took_over: DateTime<Utc>,
    /// The shard counts the fleet runs: when one goes, its leaders' pending ticks are ours.
    shard_counts: Option<BTreeSet<(Option<String>, u32)>>,
    /// When the last instant fired, and its tick.
    last_fired: Option<(DateTime<Utc>, DateTime<Utc>)>,
    /// The next instant once claimed, and the jobs whose tick it won with their fences.
    claimed: Option<(DateTime<Utc>, WonTicks)>,
    /// The next instant and whether every job due then is at-least-once: worked out once per
    /// instant, not at every wake.
    ahead_allowed: Option<(DateTime<Utc>, bool)>,
    /// When to look at backfill ticks that wait for a pause or a live run to end.
    backfills_look: Option<tokio::time::Instant>,
}

/// What operators asked of the fleet, as the node's mirrors announce it: runs by hand, and
/// backfills.
struct Asked {
    requests: watch::Receiver<u64>,
    backfills: watch::Receiver<u64>,
}

/// What woke the loop between instants.
enum Event {
    /// Time to claim the next instant, or to confirm one claimed ahead.
    Wake,
    /// Starts that no claim carried within the window.
    WriteStarts,
    /// Something changed what the loop waits for: it works out its wait again.
    Recheck,
    /// The fleet view changed; `false` once it closed.
    Fleet(bool),
    Reloaded,
    /// Runs asked for by hand.
    Requests,
    /// A backfill record changed, or ticks of one waited.
    Backfills,
    /// Room for late runs: backlogs that waited for it can be claimed.
    LateRoom,
    /// Half of a backlog claimed in parts has started.
    Refill,
    SessionEnded,
}

/// What the loop does after an event.
type Flow = Result<(), TermEnd>;

impl Term {
    /// Catches up, then fires each tick of the book's jobs on time.
    ///
    /// Each instant is claimed before it is due, then fired at its time. An instant of only
    /// at-least-once jobs is claimed as soon as the previous instant's runs have started (within
    /// [`wake::CLAIM_AHEAD`] of it), so that claim carries those starts to etcd a few milliseconds
    /// after they happen: the window in which a start not yet written can make a tick run twice.
    /// Such an instant fires only after a read shortly before it confirms the leadership, so a
    /// leader cut off since its claim leaves the tick to its successor instead of running it
    /// unrecorded. Other instants are claimed [`ClaimLead`](crate::coord::claims::ClaimLead) before
    /// they are due, which keeps short the window in which a claimed at-most-once tick can be lost.
    pub(super) async fn fire(
        &self,
        claimer: &Claimer<'_>,
        book: &mut Book,
        mut fleet: watch::Receiver<FleetView>,
        mut reloads: watch::Receiver<Arc<Loaded>>,
    ) -> TermEnd {
        // One instant for both: a tick due while the catch-up's claims are in flight is after
        // it, so the queue takes it, however long the claims take.
        let now = clock::now();
        let mut firing = Firing {
            queue: Queue::new(),
            behind: (0..book.entries().len()).collect(),
            refilling: Vec::new(),
            took_over: now,
            shard_counts: None,
            last_fired: None,
            claimed: None,
            ahead_allowed: None,
            backfills_look: None,
        };
        if let Err(end) = self.catch_up_all(claimer, book, &mut firing, now).await {
            return end;
        }
        // After the takeover's claims, which it would only delay.
        let _successes = AbortOnDropHandle::new(tokio::spawn(read_successes(
            self.session.client(),
            self.identity.keys.clone(),
            book.entries().iter().map(|entry| Arc::clone(&entry.job)).collect(),
            Arc::clone(&self.work.job_gauges),
        )));
        let mut asked = Asked {
            requests: self.mirrors.triggers.subscribe(),
            backfills: self.mirrors.backfills.subscribe(),
        };
        firing.shard_counts = fleet.borrow().families();
        loop {
            // Before any wait: what an instant found overdue after it is compared with.
            let before_wait = clock::Reading::take();
            let next = firing.queue.peek().map(|Reverse((due, _))| *due);
            let flow = match self
                .next_event(book, &mut firing, &mut fleet, &mut reloads, &mut asked, next)
                .await
            {
                Event::Wake => self.fire_next(claimer, book, &mut firing, next, before_wait).await,
                Event::WriteStarts => claimer.claim(book, &[]).await.map(drop).map_err(TermEnd::from),
                Event::Recheck => Ok(()),
                Event::Fleet(open) => self.on_fleet_change(book, &mut firing, &mut fleet, open).await,
                Event::Reloaded => Err(TermEnd::JobsReloaded(book.take())),
                Event::Requests => self.serve_requests(claimer, book).await.map_err(TermEnd::from),
                Event::Backfills => self
                    .serve_backfills(claimer, book)
                    .await
                    .map_err(TermEnd::from)
                    .map(|backlog| {
                        firing.backfills_look =
                            (backlog == Backlog::Waits).then(|| tokio::time::Instant::now() + BACKFILL_LOOK);
                    }),
                Event::LateRoom => self.catch_up_more(claimer, book, &mut firing).await,
                Event::Refill => {
                    // Only those down to half: the others' records are not rewritten at every
                    // start of another's run.
                    let (ready, waiting): (Vec<usize>, Vec<usize>) = firing
                        .refilling
                        .drain(..)
                        .partition(|index| self.starts.owed(&book.job(*index).name).len() <= MAX_OWED / 2);
                    firing.refilling = waiting;
                    firing.behind.extend(ready);
                    self.catch_up_more(claimer, book, &mut firing).await
                }
                Event::SessionEnded => Err(self.cancelled()),
            };
            if let Err(end) = flow {
                return end;
            }
        }
    }

    /// Sleeps until the next wake, or until something else needs the loop. Between the ticks is
    /// the quiet moment: no write is in flight, and a claimed tick that is not due yet stays
    /// pending in etcd for whoever leads next.
    async fn next_event(
        &self,
        book: &Book,
        firing: &mut Firing,
        fleet: &mut watch::Receiver<FleetView>,
        reloads: &mut watch::Receiver<Arc<Loaded>>,
        asked: &mut Asked,
        next: Option<DateTime<Utc>>,
    ) -> Event {
        if let Some(due) = next.filter(|due| firing.ahead_allowed.is_none_or(|(at, _)| at != *due)) {
            firing.ahead_allowed = Some((due, every_job_at_least_once(book, &firing.queue, due)));
        }
        let planned = wake::next_wake(Known {
            claimed: firing.claimed.as_ref().map(|(due, _)| *due),
            next: next.zip(firing.ahead_allowed.map(|(_, ahead)| ahead)),
            last_fired: firing.last_fired,
            claim_lead: self.claim_lead(),
        });
        let wake = async {
            match (planned.at, planned.settling) {
                (Some(at), Some(fired)) if at > clock::now() => tokio::select! {
                    _ = clock::sleep_until(at) => {}
                    _ = self.starts.all_begun(fired) => {}
                },
                (Some(at), _) => clock::sleep_until(at).await,
                (None, _) => std::future::pending().await,
            }
        };
        let between_instants = firing.claimed.is_none();
        let write_starts_at = self
            .starts
            .oldest_unrecorded()
            .map(|since| since + RIDE_WINDOW)
            .filter(|_| between_instants);
        let write_starts = async {
            match write_starts_at {
                Some(at) => {
                    tokio::time::sleep_until(at.into()).await;
                    true
                }
                None => {
                    self.starts.any_unrecorded().await;
                    false
                }
            }
        };
        let refill = {
            let jobs: Vec<String> = firing
                .refilling
                .iter()
                .map(|index| book.job(*index).name.clone())
                .collect();
            self.starts.owing_at_most(MAX_OWED / 2, jobs)
        };
        tokio::select! {
            _ = wake => Event::Wake,
            // Without a deadline it wakes at the first start made since: the loop then works out
            // when to write it.
            due = write_starts, if between_instants => if due { Event::WriteStarts } else { Event::Recheck },
            changed = fleet.changed() => Event::Fleet(changed.is_ok()),
            Ok(()) = reloads.changed() => Event::Reloaded,
            // Runs asked for by hand: between instants, like the backlogs.
            Ok(()) = asked.requests.changed(), if between_instants => Event::Requests,
            // Backfills: between instants too, behind the live ticks.
            Ok(()) = asked.backfills.changed(), if between_instants => Event::Backfills,
            _ = sleep_until_some(firing.backfills_look), if between_instants && firing.backfills_look.is_some() => Event::Backfills,
            // Jobs whose backlogs waited for room: claimed between instants, never while an
            // instant claimed ahead waits to fire.
            _ = self.work.runs.late_room(), if !firing.behind.is_empty() && between_instants => Event::LateRoom,
            // A backlog claimed in parts: the next part once half of the last has started.
            _ = refill, if !firing.refilling.is_empty() && between_instants => Event::Refill,
            _ = self.session.ended().cancelled() => Event::SessionEnded,
        }
    }

    /// Claims the next instant, or confirms the one claimed ahead, sleeps to it and starts its
    /// runs. An instant found long overdue is caught up instead (see [`OVERDUE_LIMIT`]).
    async fn fire_next(
        &self,
        claimer: &Claimer<'_>,
        book: &mut Book,
        firing: &mut Firing,
        next: Option<DateTime<Utc>>,
        before_wait: clock::Reading,
    ) -> Flow {
        let (due, won) = match firing.claimed.take() {
            // Woken shortly before an instant claimed ahead.
            Some((due, won)) => {
                claimer.confirm().await?;
                (due, won)
            }
            None => {
                let Some(due) = next else { return Ok(()) };
                let now = clock::now();
                if now - due > OVERDUE_LIMIT {
                    return self
                        .catch_up_overdue(claimer, book, firing, due, now, before_wait)
                        .await;
                }
                let won = self.claim_instant(claimer, book, &mut firing.queue, due).await?;
                if due - clock::now() > self.claim_lead() {
                    firing.claimed = Some((due, won));
                    return Ok(());
                }
                (due, won)
            }
        };
        clock::sleep_until(due).await;
        if !self.session.check_live() {
            tracing::error!(tick = %crate::clock::rfc3339(due), "the lease may have expired before the tick: not starting its claimed runs; the next leader delivers them");
            return Err(TermEnd::SessionLost);
        }
        let lateness = (clock::now() - due).to_std().unwrap_or_default();
        for &(index, fence) in &won {
            crate::metrics::get().lateness.observe(lateness.as_secs_f64());
            let job = book.job(index);
            let late = if self.starts.take_redelivery(&job.name, due) {
                Arrival::Redelivered
            } else {
                Arrival::Scheduled
            };
            self.work.runs.start(vec![self.tick(book, index, due, fence, late)]);
        }
        firing.last_fired = Some((clock::now(), due));
        Ok(())
    }

    /// An instant found due more than [`OVERDUE_LIMIT`] ago. Only a forward step of the wall
    /// clock is time no leader had: its ticks are missed, and caught up as each job's catch_up
    /// says. Ticks due while this leader stalled or waited on etcd came due while it led: it
    /// owes every one (within each job's starting_deadline). Either way they are claimed
    /// together, not fired one instant after another.
    async fn catch_up_overdue(
        &self,
        claimer: &Claimer<'_>,
        book: &mut Book,
        firing: &mut Firing,
        due: DateTime<Utc>,
        now: DateTime<Utc>,
        before_wait: clock::Reading,
    ) -> Flow {
        let step = before_wait.wall_step();
        if step > OVERDUE_LIMIT {
            tracing::warn!(
                tick = %crate::clock::rfc3339(due),
                step_ms = step.num_milliseconds(),
                "the wall clock jumped forward: the ticks it skipped are caught up as each job's catch_up says"
            );
            firing.took_over = firing.took_over.max((before_wait.wall() + step).min(now));
        } else {
            tracing::warn!(tick = %crate::clock::rfc3339(due), behind_ms = (now - due).num_milliseconds(), "this leader fell behind (a stall, or slow etcd calls): every tick due meanwhile is claimed and run late");
        }
        firing.behind = (0..book.entries().len()).collect();
        firing.refilling.clear();
        self.catch_up_all(claimer, book, firing, now).await
    }

    /// Settles every job of `behind` and queues the next tick of those settled, in place of
    /// whatever the queue held.
    async fn catch_up_all(
        &self,
        claimer: &Claimer<'_>,
        book: &mut Book,
        firing: &mut Firing,
        now: DateTime<Utc>,
    ) -> Flow {
        firing.queue = self.settle_behind(claimer, book, firing, now).await?;
        Ok(())
    }

    /// Settles the jobs of `behind` that waited, and adds their next ticks to the queue.
    async fn catch_up_more(&self, claimer: &Claimer<'_>, book: &mut Book, firing: &mut Firing) -> Flow {
        let settled = self.settle_behind(claimer, book, firing, clock::now()).await?;
        firing.queue.extend(settled);
        Ok(())
    }

    /// Catches up the jobs of `behind` as of `now`; the next tick of each one settled.
    async fn settle_behind(
        &self,
        claimer: &Claimer<'_>,
        book: &mut Book,
        firing: &mut Firing,
        now: DateTime<Utc>,
    ) -> Result<Queue, TermEnd> {
        let settled = self
            .catch_up(
                claimer,
                book,
                &mut firing.behind,
                &mut firing.refilling,
                firing.took_over,
                now,
            )
            .await?;
        Ok(self.queue(book, &settled, now))
    }

    /// A change of the fleet view: a handoff, or the last node of a shard count gone.
    async fn on_fleet_change(
        &self,
        book: &mut Book,
        firing: &mut Firing,
        fleet: &mut watch::Receiver<FleetView>,
        open: bool,
    ) -> Flow {
        if !open {
            // The view only closes when the session ends or the node stops.
            self.session.ended().cancelled().await;
            return Err(self.cancelled());
        }
        if self.should_hand_over(fleet) {
            return Err(TermEnd::HandedOff);
        }
        let counts = fleet.borrow().families();
        if let (Some(before), Some(now)) = (&firing.shard_counts, &counts) {
            let gone = counts_gone(before, now);
            if !gone.is_empty() {
                tracing::info!(gone = ?gone, "no node runs these election families (pool, shard count) any more: reading the records again for the ticks their leaders left pending");
                return Err(TermEnd::ShardCountGone(book.take()));
            }
        }
        if counts.is_some() {
            firing.shard_counts = counts;
        }
        Ok(())
    }
}

/// Whether every job due at `due` is at-least-once, so the instant may be claimed ahead.
fn every_job_at_least_once(book: &Book, queue: &Queue, due: DateTime<Utc>) -> bool {
    queue
        .iter()
        .filter(|Reverse((at, _))| *at == due)
        .all(|Reverse((_, index))| book.job(*index).delivery == Delivery::AtLeastOnce)
}
