//! A job's runs on other nodes, for `overlap = "skip"` and `"replace"`: a tick does not start
//! beside a run of its job that its record lists as going on another node until etcd shows it
//! ended ([`crate::rules::protocol::elsewhere`]). `skip` skips the tick as it does beside a run
//! on this node once that run's node says it went on past the tick, and waits while that is
//! not known; `replace` asks that node to stop the run and starts once it ended. And this
//! node's side: the runs it lists as going, and what other nodes' leaders ask of them.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::overlap::Skip;
use super::Runs;
use crate::clock;
use crate::coord::going::{self, ClaimShown, RunsHere};
use crate::coord::keys::Ask;
use crate::coord::session::Session;
use crate::coord::starts::StartedHere;
use crate::rules::config::Overlap;
use crate::rules::protocol::elsewhere::{self, ClaimedTick, Verdict};
use crate::rules::record::Going;
use crate::running::runner::{self, NotStarted, Tick};

/// How often a tick waiting for another node's run looks whether it still goes.
const LOOK_EVERY: Duration = Duration::from_millis(500);

/// At most how long a run of a skip or replace job waits for the lease it is listed on.
const LEASE_WAIT: Duration = Duration::from_secs(3);

/// How often a run waiting for that lease looks again.
const LEASE_LOOK: Duration = Duration::from_millis(50);

/// How long a leader waits for an answer, or lets one age, before it asks again whether a run
/// goes: each ask is a write, so at most one a second per run waited for.
const ASK_AGAIN: Duration = Duration::from_secs(1);

/// How long a run asked for by hand waits for a tick another leader claimed after this run's
/// claim and before its listing: a tick started is written within the ride window by a leader
/// that still writes, so one still pending past this had not started when this run was listed.
/// Waiting longer can wait forever: that tick may itself wait for a tick of this node queued
/// behind this run (each leader waits for the claims made before its own).
const CLAIMED_SINCE_WAIT: Duration = Duration::from_secs(5);

/// What a tick waiting for one run on another node asked of that run's node.
#[derive(Default)]
struct Asks {
    /// Asked to stop it (`overlap = "replace"`), once.
    stop: bool,
    /// When it was last asked whether the run still goes.
    going: Option<Instant>,
}

/// What came of waiting for the runs going on other nodes.
pub(super) enum Cleared {
    /// None goes any more: the ticks start.
    Yes,
    /// The ticks were settled (skipped) or given back (the leadership ended): nothing starts.
    No,
}

impl Runs {
    /// Waits until none of the runs the first of `ticks` lists as going elsewhere still goes,
    /// skipping the ticks as `overlap = "skip"` says, or asking those runs to stop for
    /// `"replace"`.
    pub(super) async fn clear_elsewhere(&self, ticks: &[Tick]) -> Cleared {
        let first = &ticks[0];
        let job = &first.job;
        let Some(claimed_runs) = self.runs_of_claimed(first, &first.claimed_elsewhere, None).await else {
            for tick in ticks {
                runner::span(tick).in_scope(|| self.not_starting(tick));
            }
            return Cleared::No;
        };
        let mut runs = first.elsewhere.clone();
        for run in claimed_runs {
            if run.node != first.node && !runs.contains(&run) && !first.starts.here().seen_ended(&job.name, &run) {
                runs.push(run);
            }
        }
        let mut asked: Vec<&Going> = Vec::new();
        let mut cleared = Cleared::Yes;
        'runs: for run in &runs {
            let mut asks = Asks::default();
            loop {
                // etcd out of reach: not known, as far as this node can tell.
                let shown = going::look(self.groups.client(), self.groups.keys(), &job.name, run).await;
                let verdict = shown.map_or(Verdict::Unknown, |shown| elsewhere::verdict(&shown));
                match verdict {
                    Verdict::Ended => {
                        first.starts.here().ended_elsewhere(&job.name, run);
                        continue 'runs;
                    }
                    Verdict::WentOnFor(age)
                        if job.overlap == Overlap::Skip
                            && !first.arrival.runs_late()
                            && elsewhere::skips_beside(run, age, first.scheduled_at) =>
                    {
                        let why = Skip::Elsewhere {
                            node: run.node.clone(),
                            previous_tick: run.tick,
                        };
                        self.skip_all(ticks, why);
                        cleared = Cleared::No;
                        break 'runs;
                    }
                    Verdict::WentOnFor(_) | Verdict::Unknown => {}
                }
                if self.ask_about(first, run, &mut asks).await && !asked.contains(&run) {
                    asked.push(run);
                }
                tokio::select! {
                    _ = tokio::time::sleep(LOOK_EVERY) => {}
                    _ = first.starts.leading().cancelled() => {
                        for tick in ticks {
                            runner::span(tick).in_scope(|| self.not_starting(tick));
                        }
                        cleared = Cleared::No;
                        break 'runs;
                    }
                }
            }
        }
        // Off the tick's way, and off the runs a drain waits for: the tick starts (or is settled)
        // while the asks are taken back; a node that exits meanwhile leaves them to its lease.
        for run in asked {
            let (client, keys, job, run) = (
                self.groups.client().clone(),
                self.groups.keys().clone(),
                job.name.clone(),
                run.clone(),
            );
            tokio::spawn(async move { going::withdraw(&client, &keys, &job, &run).await });
        }
        cleared
    }

    /// Asks `run`'s node whether it still goes (again once an answer aged [`ASK_AGAIN`]), and for
    /// `overlap = "replace"` once to stop it, on the lease this node lists its runs on; whether
    /// anything was asked that is to be withdrawn later.
    async fn ask_about(&self, first: &Tick, run: &Going, asks: &mut Asks) -> bool {
        let Some(lease) = self.groups.lease_now() else {
            return false;
        };
        let job = &first.job;
        let (client, keys, lease) = (self.groups.client(), self.groups.keys(), lease.lease());
        if job.overlap == Overlap::Replace && !asks.stop {
            asks.stop = going::ask(client, keys, &job.name, run, Ask::Stop, lease).await.is_ok();
            if asks.stop {
                runner::span(first).in_scope(|| tracing::info!(node = %run.node, previous_tick = %crate::clock::rfc3339(run.tick), "asked the node running this job's previous run to stop it (overlap = \"replace\")"));
            }
        }
        if asks.going.is_none_or(|at| at.elapsed() >= ASK_AGAIN)
            && going::ask(client, keys, &job.name, run, Ask::Going, lease)
                .await
                .is_ok()
        {
            if asks.going.is_none() {
                runner::span(first).in_scope(|| tracing::info!(node = %run.node, previous_tick = %crate::clock::rfc3339(run.tick), fence = run.fence, "waiting: the job's record lists its previous run going on another node and etcd shows no end of it; asked that node whether it still goes"));
            }
            asks.going = Some(Instant::now());
        }
        asks.stop || asks.going.is_some()
    }

    /// Lists `tick`'s run as going on this node in the job's records, for other nodes' leaders
    /// to see; for `overlap = "skip"` and `"replace"` jobs that run on more than this node, and
    /// every kind of run of them. Returns the lease it is listed on: once that lapses, other
    /// nodes take the run for ended, so it must be stopped.
    pub(super) fn list_going(&self, tick: &Tick) -> Option<Session> {
        let job = &tick.job;
        if job.overlap == Overlap::Allow || job.instance_of.is_some() {
            return None;
        }
        let lease = self.groups.lease_now()?;
        let going = Going {
            node: tick.node.clone(),
            tick: tick.scheduled_at,
            fence: tick.fence,
            lease: lease.lease(),
            since: clock::now(),
        };
        // A scheduled run's start is written with its ticket's; a run that took none is
        // written on its own, so a handoff or a graceful stop does not hide it, and waits for
        // that write.
        let on_its_own = !tick.arrival.owed_to_schedule();
        let new = tick.starts.here().run_going(&job.name, going, on_its_own);
        if new && on_its_own {
            tick.starts.listed(&job.name);
        }
        Some(lease)
    }

    /// A run that takes no claim of the schedule (manual, backfill) of a skip or replace job
    /// starts only once a write of its leadership lists it, and after what that write showed
    /// beside it ([`elsewhere::Beside`]): another leader's later claims see the listing and
    /// wait for the run, its earlier ones may have started beside it unlisted. A manual run
    /// waits for those runs as a scheduled tick does; a backfill tick goes back to its backfill
    /// while any shows, claimed again once its leader sees them end.
    pub(super) async fn listed_first(&self, tick: &Tick) -> Cleared {
        let job = &tick.job;
        if tick.arrival.owed_to_schedule() || self.list_going(tick).is_none() {
            return Cleared::Yes;
        }
        let here = tick.starts.here();
        let Some(beside) = here.landed(&job.name, tick.fence, tick.starts.leading()).await else {
            self.unlist_going(tick);
            self.not_starting(tick);
            return Cleared::No;
        };
        let mut going = beside.going;
        going.retain(|run| !here.seen_ended(&job.name, run) && !tick.elsewhere.contains(run));
        if going.is_empty() && beside.claimed.is_empty() {
            return Cleared::Yes;
        }
        if tick.arrival.not_started() == NotStarted::GivenBack {
            tracing::info!(runs = ?going.iter().map(|run| (&run.node, run.fence)).collect::<Vec<_>>(), claimed = ?beside.claimed.iter().map(|claimed| (&claimed.node, clock::rfc3339(claimed.tick))).collect::<Vec<_>>(), "not starting a backfill tick yet: the write that listed it shows runs of the job going on other nodes, or ticks other leaders claimed; it goes back to be claimed once they end");
            self.unlist_going(tick);
            self.give_back(tick);
            return Cleared::No;
        }
        // The claims made before this run's were in its record when it was claimed, and waited
        // for in full; those made since, only as long as a started tick takes to be written.
        let (claimed_before, claimed_since): (Vec<ClaimedTick>, Vec<ClaimedTick>) = beside
            .claimed
            .into_iter()
            .partition(|claimed| tick.claimed_elsewhere.contains(claimed));
        let Some(runs_since) = self
            .runs_of_claimed(tick, &claimed_since, Some(CLAIMED_SINCE_WAIT))
            .await
        else {
            self.unlist_going(tick);
            self.not_starting(tick);
            return Cleared::No;
        };
        for run in runs_since {
            if run.node != tick.node && !going.contains(&run) && !here.seen_ended(&job.name, &run) {
                going.push(run);
            }
        }
        let waiting = Tick {
            elsewhere: going,
            claimed_elsewhere: claimed_before,
            ..tick.clone()
        };
        let cleared = self.clear_elsewhere(std::slice::from_ref(&waiting)).await;
        if let Cleared::No = cleared {
            self.unlist_going(tick);
        }
        cleared
    }

    /// The runs of the ticks in `claimed`, which `tick` found claimed by other leaderships, once
    /// each leader has written since (the tick started or was settled): those its record lists
    /// of each tick. With `within`, a tick still pending after that long is waited for no
    /// more. `None` if the leadership ended while waiting.
    async fn runs_of_claimed(
        &self,
        tick: &Tick,
        claimed: &[ClaimedTick],
        within: Option<Duration>,
    ) -> Option<Vec<Going>> {
        let job = &tick.job.name;
        let deadline = within.map(|within| tokio::time::Instant::now() + within);
        let mut runs = Vec::new();
        for claimed in claimed {
            let mut told = false;
            loop {
                if let Some(ClaimShown::Settled(listed)) =
                    going::look_claimed(self.groups.client(), self.groups.keys(), job, claimed).await
                {
                    runs.extend(listed);
                    break;
                }
                if deadline.is_some_and(|deadline| tokio::time::Instant::now() >= deadline) {
                    runner::span(tick).in_scope(|| tracing::warn!(node = %claimed.node, claimed_tick = %crate::clock::rfc3339(claimed.tick), waited_ms = within.unwrap_or_default().as_millis() as u64, "starting without that tick's start written: another leader claimed it after this run was claimed and has not started it since this run was listed (waiting on could wait for ever: it may wait for this node's ticks queued behind this run)"));
                    break;
                }
                if !std::mem::replace(&mut told, true) {
                    runner::span(tick).in_scope(|| tracing::info!(node = %claimed.node, claimed_tick = %crate::clock::rfc3339(claimed.tick), "waiting: another leader of this job claimed a tick that may start beside this run, and has not written since whether it started"));
                }
                tokio::select! {
                    _ = tokio::time::sleep(LOOK_EVERY) => {}
                    _ = tick.starts.leading().cancelled() => return None,
                }
            }
        }
        Some(runs)
    }

    /// Whether the lease `tick`'s run would be listed on is open, waited for while the node
    /// reopens it (after an etcd outage), at most [`LEASE_WAIT`] and while the leadership
    /// lasts; true for a run no record lists.
    pub(super) async fn lease_to_list_on(&self, tick: &Tick) -> bool {
        if tick.job.overlap == Overlap::Allow || tick.job.instance_of.is_some() {
            return true;
        }
        let deadline = tokio::time::Instant::now() + LEASE_WAIT;
        loop {
            if self.groups.lease_now().is_some() {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::select! {
                _ = tokio::time::sleep(LEASE_LOOK) => {}
                _ = tick.starts.leading().cancelled() => return false,
            }
        }
    }

    /// The run listed by [`Runs::list_going`] ended.
    pub(super) fn unlist_going(&self, tick: &Tick) {
        tick.starts.here().run_ended(&tick.job.name, tick.fence);
    }
}

/// This node's runs as other nodes' leaders ask about them: stopped through [`Runs`], their age
/// read from what this node lists as going.
pub(crate) struct AskedHere {
    pub(crate) runs: Runs,
    pub(crate) listed: Arc<StartedHere>,
}

impl RunsHere for AskedHere {
    fn stop(&self, job: &str, fence: i64) {
        if self.runs.jobs.replace_run(job, fence) {
            tracing::info!(
                job,
                fence,
                "another node's leader asks for this run to stop, to start the job's next tick (overlap = \"replace\")"
            );
        }
    }

    fn age(&self, job: &str, fence: i64) -> Option<Duration> {
        let run = self.listed.own_run(job, fence)?;
        Some((clock::now() - run.since).to_std().unwrap_or_default())
    }
}
