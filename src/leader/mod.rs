//! One shard of one node: campaign, lead in terms, resign; and the firing loop of a term.
//!
//! A term keeps a time-ordered queue of its jobs' next ticks. For each instant it sleeps until
//! a little before it, claims every job due then (see [`crate::claims`]), sleeps to the instant
//! by the wall clock and starts the runs. It never fires early, and it never starts a run once
//! its lease may have expired, so a stalled leader that wakes up late does nothing.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::watch;
use tokio_util::task::AbortOnDropHandle;

mod takeover;

use crate::backoff::{sleep_or_cancel, Backoff};
use crate::catch_up::MAX_OWED;
use crate::claims::{Book, Claimer, Halt, Want};
use crate::clock;
use crate::config::{Delivery, Job};
use crate::context::{Loaded, NodeContext};
use crate::election::{self, Leadership};
use crate::repeats;
use crate::results::RIDE_WINDOW;
use crate::runner::Tick;
use crate::session::Session;
use crate::starts::Starts;
use crate::triggers::{self, Taken};
use crate::view::FleetView;

/// How long before an at-least-once instant it may be claimed: the claim then carries the
/// previous instant's starts.
const CLAIM_AHEAD: Duration = Duration::from_millis(1500);

/// At most how long after firing an instant its runs are given to start before the next
/// instant's early claim carries their starts; it goes as soon as they all have. Starts later
/// than that ride the claim after.
const STARTS_SETTLE: Duration = Duration::from_millis(50);

/// The jobs whose tick of one instant a leadership won, by index in its book, each with the
/// tick's fence.
type WonTicks = Vec<(usize, i64)>;

/// How late an instant may be before the firing loop takes it for a forward step of the wall
/// clock, or a stall, and catches up what passed instead of firing it: more than an etcd
/// election or a loaded machine delays a claim.
const OVERDUE_LIMIT: chrono::Duration = chrono::Duration::seconds(2);

/// At most how long a leadership that hands over or stops waits for the runs it was spawning,
/// so that its last write of starts includes theirs.
const SPAWNS_SETTLE: Duration = Duration::from_secs(2);

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
    /// The last node of another shard count left (a rolling change of `shards`): lead on under
    /// the same leadership, reading every record again, so the ticks that count's leaders left
    /// pending, which no successor of theirs will settle, are delivered or recorded lost here.
    ShardCountGone(Book),
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

/// Waits for `entered` (this node's candidacy in `shard`'s election) to lead, leads the shard
/// whenever elected and campaigns again after each term, until the session ends.
pub(crate) async fn run_shard(
    node: Arc<NodeContext>,
    session: Session,
    fleet: watch::Receiver<FleetView>,
    entered: Leadership,
) {
    let shard = entered.shard;
    let mut entered = Some(entered);
    let mut jobs = node.jobs.clone();
    let mut backoff = Backoff::coordination();
    let mut view = fleet.clone();
    loop {
        let campaign = async {
            match entered.take() {
                Some(candidacy) => election::elected(candidacy, &node.node_id, &mut view).await,
                None => {
                    election::campaign(
                        &session,
                        &node.keys,
                        node.shards,
                        shard,
                        &node.node_id,
                        &mut view,
                        &node.elections,
                    )
                    .await
                }
            }
        };
        let campaign = tokio::select! {
            result = campaign => result,
            _ = session.ended().cancelled() => return,
        };
        let leadership = match campaign {
            Ok(leadership) => leadership,
            Err(err) => {
                let wait = backoff.next_delay();
                if err.is_nospace() {
                    tracing::debug!(shard, error = %err, retry_in = ?wait, "etcd is out of space: the campaign waits");
                } else if let Some(left_out) = repeats::log_now("campaign failed") {
                    tracing::warn!(shard, error = %err, retry_in = ?wait, left_out, "campaign failed; retrying (left_out: lines like this one not logged since the last)");
                }
                if !sleep_or_cancel(wait, session.ended()).await {
                    return;
                }
                continue;
            }
        };
        backoff.reset();
        // One leadership may span several terms: a reload ends a term between ticks and the
        // next one leads on with the new jobs, without resigning. What the leadership owes, and
        // the retries of its runs, last as long as it does.
        let leading = session.ended().child_token();
        let _leading = leading.clone().drop_guard();
        let term = Term {
            node: Arc::clone(&node),
            session: session.clone(),
            fleet: fleet.clone(),
            starts: Arc::new(Starts::new(session.clone(), leading, Arc::clone(&node.started_here))),
            leadership,
        };
        let mut known = Some(Book::default());
        while let Some(book) = known.take() {
            let shard_jobs = jobs.borrow_and_update().by_shard[shard as usize].clone();
            tracing::info!(
                shard,
                term = term.leadership.term,
                jobs = shard_jobs.len(),
                "leading shard"
            );
            let shards_led = &crate::metrics::get().shards_led;
            shards_led.inc();
            let gauges = crate::job_gauges::get();
            gauges.leading(shard, shard_jobs.clone());
            let end = term.lead(shard_jobs, book, jobs.clone()).await;
            gauges.not_leading(shard);
            shards_led.dec();
            tracing::info!(shard, term = term.leadership.term, reason = ?end, "term ended");
            match end {
                TermEnd::JobsReloaded(book) => known = Some(book),
                TermEnd::ShardCountGone(book) => known = Some(book.forgotten()),
                TermEnd::Deposed => {}
                TermEnd::HandedOff => {
                    if !resign(&node, &session, &term.leadership).await {
                        return;
                    }
                }
                TermEnd::Stopped | TermEnd::SessionLost => return,
            }
        }
    }
}

/// Resigns `leadership`, trying again until etcd confirms it; false if the session ended first.
/// Campaigning again with the key still there would lead again under the same term with an
/// empty book: the ticks the handed-off term owed would be neither fired nor adopted (claims
/// stamped with this term look like the new term's own), and its next write would drop them.
async fn resign(node: &NodeContext, session: &Session, leadership: &Leadership) -> bool {
    let mut backoff = Backoff::coordination();
    loop {
        match node.elections.request(election::resign(session, leadership)).await {
            Ok(()) => return true,
            Err(err) => {
                let wait = backoff.next_delay();
                if let Some(left_out) = repeats::log_now("resign failed") {
                    tracing::warn!(shard = leadership.shard, term = leadership.term, error = %err, retry_in = ?wait, left_out, "could not resign a handed-off shard; trying again before campaigning (left_out: lines like this one not logged since the last)");
                }
                if !sleep_or_cancel(wait, session.ended()).await {
                    return false;
                }
            }
        }
    }
}

/// Learns the last success of a new term's jobs, for their gauges; a failure only leaves the
/// gauges to this node's own runs.
async fn read_successes(client: etcd_client::Client, keys: crate::keys::Keys, jobs: Vec<Arc<Job>>) {
    if let Err(err) = crate::job_gauges::read_successes(&client, &keys, &jobs).await {
        tracing::debug!(error = %err, "cannot read the jobs' last successes; their gauges start from this node's runs");
    }
}

/// One leadership of one shard.
struct Term {
    node: Arc<NodeContext>,
    session: Session,
    fleet: watch::Receiver<FleetView>,
    leadership: Leadership,
    /// The ticks this leadership owes; its token ends with the leadership (not at a reload).
    starts: Arc<Starts>,
}

impl Term {
    /// Leads the shard with `jobs` until shutdown, the session's loss, deposition, a handoff or
    /// a reload of the node's jobs, starting from what `known` knew of them.
    async fn lead(&self, jobs: Vec<Arc<Job>>, known: Book, reloads: watch::Receiver<Arc<Loaded>>) -> TermEnd {
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
                tracing::warn!(
                    shard = self.leadership.shard,
                    "runs still spawning after the leadership ended: the next leader may run them again"
                );
                claimer.claim(&mut book, &[]).await.map(drop)
            };
            if let Err(halt) = last_write {
                tracing::warn!(shard = self.leadership.shard, reason = ?halt, "could not write the last starts: the next leader runs those ticks again");
            }
        }
        end
    }

    /// Catches up, then fires each tick of the book's jobs on time.
    ///
    /// Each instant is claimed before it is due, then fired at its time. An instant of only
    /// at-least-once jobs is claimed as soon as the previous instant's runs have started (within
    /// [`CLAIM_AHEAD`] of it), so that claim carries those starts to etcd a few milliseconds after
    /// they happen: the window in which a start not yet written can make a tick run twice. Such
    /// an instant fires only after a read shortly before it confirms the leadership, so a leader
    /// cut off since its claim leaves the tick to its successor instead of running it unrecorded.
    /// Other instants are claimed [`ClaimLead`](crate::claims::ClaimLead) before they are due,
    /// which keeps short the window in which a claimed at-most-once tick can be lost.
    async fn fire(
        &self,
        claimer: &Claimer<'_>,
        book: &mut Book,
        mut fleet: watch::Receiver<FleetView>,
        mut reloads: watch::Receiver<Arc<Loaded>>,
    ) -> TermEnd {
        // One instant for both: a tick due while the catch-up's claims are in flight is after
        // it, so the queue takes it, however long the claims take.
        let now = clock::now();
        let mut behind: VecDeque<usize> = (0..book.entries().len()).collect();
        // Jobs whose backlog is longer than they may owe at once: the rest is claimed in parts.
        let mut refilling: Vec<usize> = Vec::new();
        // Where the jobs of `behind` stopped being missed: what is due after it, this leader owes.
        let mut took_over = now;
        let mut queue = match self
            .catch_up(claimer, book, &mut behind, &mut refilling, took_over, now)
            .await
        {
            Ok(settled) => self.queue(book, &settled, now),
            Err(halt) => return halt.into(),
        };
        // After the takeover's claims, which it would only delay.
        let _successes = AbortOnDropHandle::new(tokio::spawn(read_successes(
            self.session.client(),
            self.node.keys.clone(),
            book.entries().iter().map(|entry| Arc::clone(&entry.job)).collect(),
        )));
        let mut requests = self.node.triggers.subscribe();
        // The shard counts the fleet runs: when one goes, its leaders' pending ticks are ours.
        let mut shard_counts = fleet.borrow().shard_counts();
        // When the last instant fired, and its tick.
        let mut last_fired: Option<(DateTime<Utc>, DateTime<Utc>)> = None;
        // The next instant once claimed, and the jobs whose tick it won with their fences.
        let mut claimed: Option<(DateTime<Utc>, WonTicks)> = None;
        // The next instant and whether every job due then is at-least-once: worked out once per
        // instant, not at every wake.
        let mut ahead_allowed: Option<(DateTime<Utc>, bool)> = None;

        loop {
            // Before any wait: what an instant found overdue after it is compared with.
            let before_wait = clock::Reading::take();
            let next = queue.peek().map(|Reverse((due, _))| *due);
            if let Some(due) = next.filter(|due| ahead_allowed.is_none_or(|(at, _)| at != *due)) {
                ahead_allowed = Some((due, every_job_at_least_once(book, &queue, due)));
            }
            let wake_at = match (&claimed, next, ahead_allowed) {
                (Some((due, _)), _, _) => Some(*due - self.claim_lead()),
                (None, Some(due), Some((_, ahead))) => Some(self.claim_time(due, ahead, last_fired.map(|(at, _)| at))),
                (None, _, _) => None,
            };
            // An early claim waits for the last instant's runs to start, at most STARTS_SETTLE.
            let settle = chrono::Duration::from_std(STARTS_SETTLE).unwrap_or_default();
            let settling = match (&claimed, last_fired, wake_at) {
                (None, Some((fired_at, fired)), Some(at)) if at <= fired_at + settle => Some(fired),
                _ => None,
            };
            let wake = async {
                match (wake_at, settling) {
                    (Some(at), Some(fired)) if at > clock::now() => tokio::select! {
                        _ = clock::sleep_until(at) => {}
                        _ = self.starts.all_begun(fired) => {}
                    },
                    (Some(at), _) => clock::sleep_until(at).await,
                    (None, _) => std::future::pending().await,
                }
            };
            let write_starts_at = self
                .starts
                .oldest_unrecorded()
                .map(|since| since + RIDE_WINDOW)
                .filter(|_| claimed.is_none());
            let write_starts = async {
                match write_starts_at {
                    Some(at) => tokio::time::sleep_until(at.into()).await,
                    None => self.starts.any_unrecorded().await,
                }
            };
            let refill = {
                let jobs: Vec<String> = refilling.iter().map(|index| book.job(*index).name.clone()).collect();
                self.starts.owing_at_most(MAX_OWED / 2, jobs)
            };
            // Between the ticks is the quiet moment: no write is in flight, and a claimed tick
            // that is not due yet stays pending in etcd for whoever leads next.
            tokio::select! {
                _ = wake => {}
                _ = write_starts, if claimed.is_none() => {
                    // Starts that no claim carried within the window are written on their own.
                    if write_starts_at.is_some() {
                        if let Err(halt) = claimer.claim(book, &[]).await {
                            return halt.into();
                        }
                    }
                    continue;
                }
                changed = fleet.changed() => {
                    if changed.is_err() {
                        // The view only closes when the session ends or the node stops.
                        self.session.ended().cancelled().await;
                        return self.cancelled();
                    }
                    if self.should_hand_over(&mut fleet) {
                        return TermEnd::HandedOff;
                    }
                    let counts = fleet.borrow().shard_counts();
                    if let (Some(before), Some(now)) = (&shard_counts, &counts) {
                        let gone: Vec<u32> = before.difference(now).copied().collect();
                        if !gone.is_empty() {
                            tracing::info!(shard = self.leadership.shard, gone = ?gone, "no node runs these shard counts any more: reading the records again for the ticks their leaders left pending");
                            return TermEnd::ShardCountGone(std::mem::take(book));
                        }
                    }
                    if counts.is_some() {
                        shard_counts = counts;
                    }
                    continue;
                }
                Ok(()) = reloads.changed() => return TermEnd::JobsReloaded(std::mem::take(book)),
                // Runs asked for by hand: between instants, like the backlogs.
                Ok(()) = requests.changed(), if claimed.is_none() => {
                    if let Err(halt) = self.serve_requests(claimer, book).await {
                        return halt.into();
                    }
                    continue;
                }
                // Jobs whose backlogs waited for room: claimed between instants, never while an
                // instant claimed ahead waits to fire.
                _ = self.node.runs.late_room(), if !behind.is_empty() && claimed.is_none() => {
                    let now = clock::now();
                    match self.catch_up(claimer, book, &mut behind, &mut refilling, took_over, now).await {
                        Ok(settled) => queue.extend(self.queue(book, &settled, now)),
                        Err(halt) => return halt.into(),
                    }
                    continue;
                }
                // A backlog claimed in parts: the next part once half of the last has started.
                _ = refill, if !refilling.is_empty() && claimed.is_none() => {
                    // Only those down to half: the others' records are not rewritten at every
                    // start of another's run.
                    let (ready, waiting): (Vec<usize>, Vec<usize>) = refilling
                        .drain(..)
                        .partition(|index| self.starts.owed(&book.job(*index).name).len() <= MAX_OWED / 2);
                    refilling = waiting;
                    behind.extend(ready);
                    let now = clock::now();
                    match self.catch_up(claimer, book, &mut behind, &mut refilling, took_over, now).await {
                        Ok(settled) => queue.extend(self.queue(book, &settled, now)),
                        Err(halt) => return halt.into(),
                    }
                    continue;
                }
                _ = self.session.ended().cancelled() => return self.cancelled(),
            }
            let (due, won) = match claimed.take() {
                // Woken shortly before an instant claimed ahead.
                Some((due, won)) => {
                    if let Err(halt) = claimer.confirm().await {
                        return halt.into();
                    }
                    (due, won)
                }
                None => {
                    let Some(due) = next else { continue };
                    let now = clock::now();
                    if now - due > OVERDUE_LIMIT {
                        // Only a forward step of the wall clock is time no leader had: its ticks
                        // are missed, and caught up as each job's catch_up says. Ticks due while
                        // this leader stalled or waited on etcd came due while it led: it owes
                        // every one (within each job's starting_deadline). Either way they are
                        // claimed together, not fired one instant after another.
                        let step = before_wait.wall_step();
                        if step > OVERDUE_LIMIT {
                            tracing::warn!(shard = self.leadership.shard, tick = %due, step_ms = step.num_milliseconds(), "the wall clock jumped forward: the ticks it skipped are caught up as each job's catch_up says");
                            took_over = took_over.max((before_wait.wall() + step).min(now));
                        } else {
                            tracing::warn!(shard = self.leadership.shard, tick = %due, behind_ms = (now - due).num_milliseconds(), "this leader fell behind (a stall, or slow etcd calls): every tick due meanwhile is claimed and run late");
                        }
                        behind = (0..book.entries().len()).collect();
                        refilling.clear();
                        queue = match self
                            .catch_up(claimer, book, &mut behind, &mut refilling, took_over, now)
                            .await
                        {
                            Ok(settled) => self.queue(book, &settled, now),
                            Err(halt) => return halt.into(),
                        };
                        continue;
                    }
                    let won = match self.claim_instant(claimer, book, &mut queue, due).await {
                        Ok(won) => won,
                        Err(halt) => return halt.into(),
                    };
                    if due - clock::now() > self.claim_lead() {
                        claimed = Some((due, won));
                        continue;
                    }
                    (due, won)
                }
            };
            clock::sleep_until(due).await;
            if !self.session.check_live() {
                tracing::error!(shard = self.leadership.shard, tick = %due, "the lease may have expired before the tick: not starting its claimed runs; the next leader delivers them");
                return TermEnd::SessionLost;
            }
            let lateness = (clock::now() - due).to_std().unwrap_or_default();
            for &(index, fence) in &won {
                crate::metrics::get().lateness.observe(lateness.as_secs_f64());
                let job = book.job(index);
                let late = if self.starts.take_redelivery(&job.name, due) {
                    Late::Redelivered
                } else {
                    Late::OnTime
                };
                self.node.runs.start(vec![self.tick(job, due, fence, late)]);
            }
            last_fired = Some((clock::now(), due));
        }
    }

    /// Each of `jobs`' next tick after `now`, a tick this leadership claimed ahead and owes
    /// first.
    fn queue(&self, book: &Book, jobs: &[usize], now: DateTime<Utc>) -> BinaryHeap<Reverse<(DateTime<Utc>, usize)>> {
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
    fn claim_lead(&self) -> chrono::Duration {
        chrono::Duration::from_std(self.node.claim_lead.lead()).unwrap_or_default()
    }

    /// When to claim the instant `due`: ahead, once the last instant's runs have had a moment to
    /// start, if it may be claimed ahead (`ahead`); otherwise shortly before it is due.
    fn claim_time(&self, due: DateTime<Utc>, ahead: bool, last_fired: Option<DateTime<Utc>>) -> DateTime<Utc> {
        let just_before = due - self.claim_lead();
        if !ahead {
            return just_before;
        }
        let ahead = due - chrono::Duration::from_std(CLAIM_AHEAD).unwrap_or_default();
        let settled = last_fired.map(|at| at + chrono::Duration::from_std(STARTS_SETTLE).unwrap_or_default());
        settled.map_or(ahead, |settled| settled.max(ahead)).min(just_before)
    }

    /// Claims every job due at `due` that this leadership does not owe yet, takes them off the
    /// queue with their next ticks queued, and returns the jobs whose tick is theirs to fire,
    /// each with its fence.
    async fn claim_instant(
        &self,
        claimer: &Claimer<'_>,
        book: &mut Book,
        queue: &mut BinaryHeap<Reverse<(DateTime<Utc>, usize)>>,
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
        let ahead_ms = (due - clock::now()).num_microseconds().unwrap_or_default() as f64 / 1000.0;
        tracing::debug!(shard = self.leadership.shard, tick = %due, jobs = won.len(), ahead_ms, "claimed");
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

    fn claimer(&self) -> Claimer<'_> {
        Claimer {
            session: &self.session,
            keys: &self.node.keys,
            leadership: &self.leadership,
            node_id: &self.node.node_id,
            starts: &self.starts,
            results: &self.node.results,
            lead: &self.node.claim_lead,
            shutdown: &self.node.shutdown,
            releasing: false,
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

    fn tick(&self, job: &Arc<Job>, scheduled_at: DateTime<Utc>, fence: i64, late: Late) -> Tick {
        Tick {
            job: Arc::clone(job),
            scheduled_at,
            fence,
            term: self.leadership.term,
            node: self.node.node_id.clone(),
            starts: Arc::clone(&self.starts),
            caught_up: late != Late::OnTime,
            redelivered: late == Late::Redelivered,
            request: None,
        }
    }

    /// Claims the runs asked for by hand of this shard's jobs and starts those it won. Each
    /// takes one transaction: requests are rare, and each must be answered on its own.
    async fn serve_requests(&self, claimer: &Claimer<'_>, book: &Book) -> Result<(), Halt> {
        let mut requests: VecDeque<_> = self.node.triggers.take_for(|job| book.index_of(job).is_some()).into();
        while let Some(request) = requests.pop_front() {
            let Some(index) = book.index_of(&request.job) else {
                continue;
            };
            let job = book.job(index);
            let claimed = claimer
                .retry(|| {
                    triggers::claim(
                        &self.session,
                        &self.node.keys,
                        &self.leadership,
                        &self.node.node_id,
                        &request,
                    )
                })
                .await;
            let taken = match claimed {
                Ok(taken) => taken,
                Err(halt) => {
                    // Still in etcd: this node serves them if it leads again.
                    requests.push_front(request);
                    self.node.triggers.put_back(requests);
                    return Err(halt);
                }
            };
            match taken {
                Taken::Ours(fence) => {
                    tracing::info!(shard = self.leadership.shard, job = %job.name, request = %request.id, fence, "starting a run asked for by hand");
                    crate::metrics::get()
                        .triggered_runs
                        .get_or_create(&crate::metrics::JobLabel::new(&job.name))
                        .inc();
                    self.node.runs.start(vec![Tick {
                        request: Some(request.id.clone()),
                        ..self.tick(job, request.requested_at, fence, Late::OnTime)
                    }]);
                }
                Taken::Gone => {
                    tracing::info!(job = %job.name, request = %request.id, "a run asked for by hand was withdrawn or taken by another leader")
                }
                Taken::Deposed => {
                    requests.push_front(request);
                    self.node.triggers.put_back(requests);
                    return Err(Halt::Deposed);
                }
            }
        }
        Ok(())
    }

    fn should_hand_over(&self, fleet: &mut watch::Receiver<FleetView>) -> bool {
        let hand_over = fleet
            .borrow_and_update()
            .should_hand_over(self.leadership.shard, &self.node.node_id);
        if hand_over {
            tracing::info!(
                shard = self.leadership.shard,
                term = self.leadership.term,
                "handing the shard to its target node, which is campaigning for it"
            );
        }
        hand_over
    }
}

/// Whether every job due at `due` is at-least-once, so the instant may be claimed ahead.
fn every_job_at_least_once(
    book: &Book,
    queue: &BinaryHeap<Reverse<(DateTime<Utc>, usize)>>,
    due: DateTime<Utc>,
) -> bool {
    queue
        .iter()
        .filter(|Reverse((at, _))| *at == due)
        .all(|Reverse((_, index))| book.job(*index).delivery == Delivery::AtLeastOnce)
}

/// How a tick comes to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Late {
    /// Claimed just before it was due.
    OnTime,
    /// Missed while the shard had no leader.
    CaughtUp,
    /// Claimed by an earlier leader that never started it.
    Redelivered,
}
