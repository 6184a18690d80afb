//! One term of leadership of one shard: catch up on missed ticks, then fire each tick on time.
//!
//! The loop keeps a time-ordered queue of its jobs' next ticks. For each instant it sleeps until
//! a little before it, claims every job due then in one guarded transaction, sleeps to the
//! instant by the wall clock and starts the runs. It never fires early, and it never starts a run
//! once its lease may have expired, so a stalled leader that wakes up late does nothing.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::catch_up::{missed_ticks, MAX_CATCH_UP};
use crate::clock;
use crate::config::Job;
use crate::election::{self, Leadership};
use crate::etcd::CoordError;
use crate::fleet::FleetView;
use crate::keys::Keys;
use crate::ledger::{self, ClaimRequest, Seen, MAX_OPS_PER_TXN};
use crate::node::Loaded;
use crate::record::Claim;
use crate::runner::Tick;
use crate::runs::Runs;
use crate::session::Session;

/// How far ahead of a tick to claim it: a few times the recent claim latency, within bounds.
///
/// Claiming ahead keeps the etcd round trip out of the spawn's lateness. The lead is also the
/// window in which a leader that dies after claiming a tick loses it, so it is kept as short as
/// the measured latency allows instead of a fixed generous margin.
#[derive(Clone)]
pub struct ClaimLead {
    average_micros: Arc<AtomicU64>,
}

impl ClaimLead {
    const MIN: Duration = Duration::from_millis(3);
    const MAX: Duration = Duration::from_millis(50);
    const INITIAL: Duration = Duration::from_millis(10);

    pub fn new() -> Self {
        ClaimLead {
            average_micros: Arc::new(AtomicU64::new(Self::INITIAL.as_micros() as u64 / 3)),
        }
    }

    pub fn lead(&self) -> Duration {
        let average = Duration::from_micros(self.average_micros.load(Ordering::Relaxed));
        (average * 3).clamp(Self::MIN, Self::MAX)
    }

    /// Folds one claim's round trip into the moving average (weight 1/8).
    pub fn observe(&self, took: Duration) {
        let took = took.as_micros().min(u128::from(u32::MAX)) as u64;
        let average = self.average_micros.load(Ordering::Relaxed);
        self.average_micros
            .store(average - average / 8 + took / 8, Ordering::Relaxed);
    }
}

impl Default for ClaimLead {
    fn default() -> Self {
        Self::new()
    }
}
/// Pause between attempts when etcd fails a call during a term.
const RETRY_PAUSE: Duration = Duration::from_millis(200);

/// Why a term ended; the shard task decides what comes next.
#[derive(Debug, PartialEq, Eq)]
pub enum TermEnd {
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
    JobsReloaded(Memory),
}

/// What a term knew of each job's record when it ended: the next term of the same leadership
/// starts from it instead of reading etcd again, so a reload costs no tick.
#[derive(Default, PartialEq, Eq)]
pub struct Memory(std::collections::HashMap<String, (i64, Option<DateTime<Utc>>)>);

impl std::fmt::Debug for Memory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} jobs remembered", self.0.len())
    }
}

/// What a term needs to know about its node and shard.
pub struct Term {
    pub session: Session,
    pub keys: Keys,
    pub election_prefix: String,
    pub node_id: String,
    pub jobs: Vec<Arc<Job>>,
    /// Changes when a reload replaces the node's jobs.
    pub jobs_reloaded: watch::Receiver<Arc<Loaded>>,
    pub runs: Runs,
    pub stop: CancellationToken,
    pub leadership: Leadership,
    pub claim_lead: ClaimLead,
    pub shards: u32,
    pub fleet: watch::Receiver<FleetView>,
    /// Cancelled when this leadership ends (not at a reload): runs it started retry no more.
    pub leading: CancellationToken,
    /// What the previous term of this leadership knew, if a reload ended it.
    pub memory: Memory,
}

struct JobState {
    job: Arc<Job>,
    revision: i64,
    last: Option<DateTime<Utc>>,
}

impl Term {
    /// Leads the shard until shutdown, the session's loss or deposition.
    pub async fn lead(&self) -> TermEnd {
        let mut fleet = self.fleet.clone();
        let mut jobs_reloaded = self.jobs_reloaded.clone();
        if self.should_hand_over(&mut fleet) {
            return TermEnd::HandedOff;
        }
        let unknown: Vec<&str> = self
            .jobs
            .iter()
            .map(|job| job.name.as_str())
            .filter(|name| !self.memory.0.contains_key(*name))
            .collect();
        let seen = match self
            .retry(|| ledger::read_claims(&self.session, &self.keys, &unknown))
            .await
        {
            Ok(seen) => seen,
            Err(end) => return end,
        };
        let mut seen = seen.into_iter();
        let mut states: Vec<JobState> = self
            .jobs
            .iter()
            .map(|job| {
                let (revision, last) = match self.memory.0.get(&job.name) {
                    Some(known) => *known,
                    None => {
                        let read = seen.next().unwrap_or_default();
                        (read.mod_revision, read.claim.map(|claim| claim.scheduled_at))
                    }
                };
                JobState {
                    job: Arc::clone(job),
                    revision,
                    last,
                }
            })
            .collect();
        if let Err(end) = self.catch_up(&mut states).await {
            return end;
        }

        let now = clock::now();
        let mut queue: BinaryHeap<Reverse<(DateTime<Utc>, usize)>> = states
            .iter()
            .enumerate()
            .filter_map(|(index, state)| {
                let from = state.last.map_or(now, |last| last.max(now));
                state.job.schedule.next_after(from).map(|next| Reverse((next, index)))
            })
            .collect();

        loop {
            let claim_at = queue
                .peek()
                .map(|Reverse((due, _))| *due - chrono::Duration::from_std(self.claim_lead.lead()).unwrap_or_default());
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
                        return tokio::select! {
                            _ = self.stop.cancelled() => TermEnd::Stopped,
                            _ = self.session.lost().cancelled() => TermEnd::SessionLost,
                        };
                    }
                    if self.should_hand_over(&mut fleet) {
                        return TermEnd::HandedOff;
                    }
                    continue;
                }
                Ok(()) = jobs_reloaded.changed() => {
                    let memory = states
                        .iter()
                        .map(|state| (state.job.name.clone(), (state.revision, state.last)))
                        .collect();
                    return TermEnd::JobsReloaded(Memory(memory));
                }
                _ = self.stop.cancelled() => return TermEnd::Stopped,
                _ = self.session.lost().cancelled() => return TermEnd::SessionLost,
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
            let claimed = match self.claim(&mut states, &due_now, due).await {
                Ok(claimed) => claimed,
                Err(end) => return end,
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
                self.runs.start(vec![self.tick(&states[*index].job, due)]);
            }
            for index in due_now {
                if let Some(next) = states[index].job.schedule.next_after(due) {
                    queue.push(Reverse((next, index)));
                }
            }
        }
    }

    fn tick(&self, job: &Arc<Job>, scheduled_at: DateTime<Utc>) -> Tick {
        Tick {
            job: Arc::clone(job),
            scheduled_at,
            fence: self.leadership.fence,
            node: self.node_id.clone(),
            leading: self.leading.clone(),
        }
    }

    fn should_hand_over(&self, fleet: &mut watch::Receiver<FleetView>) -> bool {
        let hand_over = fleet
            .borrow_and_update()
            .should_hand_over(self.shards, self.leadership.shard, &self.node_id);
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
    async fn catch_up(&self, states: &mut [JobState]) -> Result<(), TermEnd> {
        let now = clock::now();
        let mut pending: Vec<(usize, Vec<DateTime<Utc>>)> = Vec::new();
        for (index, state) in states.iter().enumerate() {
            let missed = missed_ticks(&state.job, state.last, now);
            if missed.truncated {
                tracing::warn!(job = %state.job.name, kept = MAX_CATCH_UP, "more ticks were missed than one takeover catches up: running only the newest");
            }
            if !missed.ticks.is_empty() {
                pending.push((index, missed.ticks));
            }
        }
        for chunk in pending.chunks(MAX_OPS_PER_TXN) {
            let indexes: Vec<usize> = chunk.iter().map(|(index, _)| *index).collect();
            let newest = |index: usize| {
                chunk
                    .iter()
                    .find(|(i, _)| *i == index)
                    .and_then(|(_, ticks)| ticks.last().copied())
            };
            let claimed = self.claim_each(states, &indexes, newest).await?;
            for (index, ticks) in chunk.iter().filter(|(index, _)| claimed.contains(index)) {
                let job = &states[*index].job;
                tracing::info!(job = %job.name, ticks = ticks.len(), first = %ticks[0], policy = ?job.catch_up, "catching up missed ticks");
                crate::metrics::get().catch_up_runs.inc_by(ticks.len() as u64);
                self.runs
                    .start(ticks.iter().map(|tick| self.tick(job, *tick)).collect());
            }
        }
        Ok(())
    }

    /// Claims tick `due` for the jobs at `indexes` and returns the ones claimed.
    async fn claim(
        &self,
        states: &mut [JobState],
        indexes: &[usize],
        due: DateTime<Utc>,
    ) -> Result<Vec<usize>, TermEnd> {
        let mut claimed = Vec::with_capacity(indexes.len());
        for chunk in indexes.chunks(MAX_OPS_PER_TXN) {
            claimed.extend(self.claim_each(states, chunk, |_| Some(due)).await?);
        }
        Ok(claimed)
    }

    /// One guarded claim transaction for at most [`MAX_OPS_PER_TXN`] jobs, each at the tick
    /// `tick_of` gives it. When the transaction fails or its outcome is unknown, the records are
    /// re-read: a claim that did land is ours, a record that moved past the tick means another
    /// leader ran it, anything else is claimed again while this node still leads.
    async fn claim_each(
        &self,
        states: &mut [JobState],
        indexes: &[usize],
        tick_of: impl Fn(usize) -> Option<DateTime<Utc>>,
    ) -> Result<Vec<usize>, TermEnd> {
        let mut wanted: Vec<(usize, DateTime<Utc>)> = indexes
            .iter()
            .filter_map(|&index| tick_of(index).map(|tick| (index, tick)))
            .filter(|(index, tick)| states[*index].last.is_none_or(|last| last < *tick))
            .collect();
        let mut claimed = Vec::with_capacity(wanted.len());
        while !wanted.is_empty() {
            if !self.session.is_live() {
                return Err(TermEnd::SessionLost);
            }
            if self.stop.is_cancelled() && claimed.is_empty() {
                return Err(TermEnd::Stopped);
            }
            let requests: Vec<ClaimRequest> = wanted
                .iter()
                .map(|&(index, tick)| ClaimRequest {
                    job: states[index].job.name.clone(),
                    expected_revision: states[index].revision,
                    claim: Claim {
                        scheduled_at: tick,
                        fence: self.leadership.fence,
                        node: self.node_id.clone(),
                    },
                })
                .collect();
            // Earlier runs' results ride along: the claim is a write etcd makes anyway.
            let riders = self
                .runs
                .results()
                .take_for(self.leadership.shard, MAX_OPS_PER_TXN - requests.len());
            let sent = std::time::Instant::now();
            let carried: Vec<(&str, &crate::record::RunRecord)> =
                riders.iter().map(|rider| (rider.job.as_str(), &rider.record)).collect();
            let outcome = ledger::claim(&self.session, &self.keys, &self.leadership, &requests, &carried).await;
            self.claim_lead.observe(sent.elapsed());
            self.runs.results().settle(riders, matches!(outcome, Ok(Some(_))));
            match outcome {
                Ok(Some(revision)) => {
                    for (index, tick) in wanted.drain(..) {
                        states[index].revision = revision;
                        states[index].last = Some(tick);
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
                    match election::still_leads(&self.session, &self.election_prefix, &self.leadership).await {
                        Ok(true) => {}
                        Ok(false) => return Err(TermEnd::Deposed),
                        Err(err) => self.pause_after(&err).await?,
                    }
                }
                Err(err) => self.pause_after(&err).await?,
            }
            let names: Vec<&str> = wanted
                .iter()
                .map(|&(index, _)| states[index].job.name.as_str())
                .collect();
            let seen = self
                .retry(|| ledger::read_claims(&self.session, &self.keys, &names))
                .await?;
            let mut still_wanted = Vec::new();
            for ((index, tick), seen) in wanted.into_iter().zip(seen) {
                match self.resolve(&seen, tick) {
                    Resolution::Ours => claimed.push(index),
                    Resolution::TakenByOther => {
                        tracing::info!(job = %states[index].job.name, tick = %tick, "tick already claimed by another leader: not running it here");
                    }
                    Resolution::Open => still_wanted.push((index, tick)),
                }
                states[index].revision = seen.mod_revision;
                states[index].last = seen.claim.map(|claim| claim.scheduled_at);
            }
            wanted = still_wanted;
        }
        Ok(claimed)
    }

    fn resolve(&self, seen: &Seen, tick: DateTime<Utc>) -> Resolution {
        match &seen.claim {
            Some(claim)
                if claim.scheduled_at == tick && claim.fence == self.leadership.fence && claim.node == self.node_id =>
            {
                Resolution::Ours
            }
            Some(claim) if claim.scheduled_at >= tick => Resolution::TakenByOther,
            _ => Resolution::Open,
        }
    }

    /// Retries an etcd read until it succeeds or the term must end.
    async fn retry<T, F, Fut>(&self, mut call: F) -> Result<T, TermEnd>
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

    async fn pause_after(&self, err: &CoordError) -> Result<(), TermEnd> {
        tracing::warn!(shard = self.leadership.shard, error = %err, "etcd call failed during the term; retrying");
        tokio::select! {
            _ = tokio::time::sleep(RETRY_PAUSE) => {}
            _ = self.session.lost().cancelled() => return Err(TermEnd::SessionLost),
            _ = self.stop.cancelled() => return Err(TermEnd::Stopped),
        }
        if self.session.is_live() {
            Ok(())
        } else {
            Err(TermEnd::SessionLost)
        }
    }
}

enum Resolution {
    Ours,
    TakenByOther,
    Open,
}

#[cfg(test)]
mod tests {
    use super::ClaimLead;
    use std::time::Duration;

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
}
