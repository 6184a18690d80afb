//! One shard of one node: campaign, lead in terms, resign; and the firing loop of a term.
//!
//! A term keeps a time-ordered queue of its jobs' next ticks. For each instant it sleeps until
//! a little before it, claims every job due then (see [`crate::coord::claims`]), sleeps to the instant
//! by the wall clock and starts the runs. It never fires early, and it never starts a run once
//! its lease may have expired, so a stalled leader that wakes up late does nothing.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tracing::Instrument;

mod backfill;
mod fire;
mod takeover;
mod term;
mod wake;

use term::Term;

use crate::backoff::{sleep_or_cancel, Backoff};
use crate::context::NodeContext;
use crate::coord::claims::{Book, Halt};
use crate::coord::election::{self, Leadership};
use crate::coord::etcd::CoordError;
use crate::coord::session::Session;
use crate::coord::starts::Starts;
use crate::coord::view::FleetView;
use crate::repeats;
use crate::rules::config::Job;
use crate::rules::config::Loaded;

/// The jobs whose tick of one instant a leadership won, by index in its book, each with the
/// tick's fence.
pub(super) type WonTicks = Vec<(usize, i64)>;

/// Whether a term's backfills have ticks that wait for something no record change announces
/// (a pause's end, the end of a live run, a gone node leaving the fleet view): the term looks
/// again soon.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Backlog {
    Settled,
    Waits,
}

/// At most how long a leadership that hands over or stops waits for the runs it was spawning,
/// so that its last write of starts includes theirs.
pub(super) const SPAWNS_SETTLE: Duration = Duration::from_secs(2);

/// Why a term ended; the shard task decides what comes next.
#[derive(Debug)]
pub(super) enum TermEnd {
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
        let leadership = match campaign(&node, &session, shard, entered.take(), &mut view).await {
            Campaigned::Leads(leadership) => leadership,
            // A stop ends the fleet view a campaign waits on: no failure to report.
            Campaigned::Failed(_) if session.ended().is_cancelled() => return,
            Campaigned::Failed(err) => {
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
            Campaigned::SessionEnded => return,
        };
        backoff.reset();
        // Every line of the leadership's terms carries its shard and term.
        let span = tracing::info_span!("term", shard, term = leadership.term);
        if !hold(&node, &session, &fleet, leadership, &mut jobs)
            .instrument(span)
            .await
        {
            return;
        }
    }
}

enum Campaigned {
    Leads(Leadership),
    Failed(CoordError),
    SessionEnded,
}

/// Waits for `entered` to lead, or campaigns again when there is none.
async fn campaign(
    node: &NodeContext,
    session: &Session,
    shard: u32,
    entered: Option<Leadership>,
    view: &mut watch::Receiver<FleetView>,
) -> Campaigned {
    let campaign = async {
        match entered {
            Some(candidacy) => election::elected(candidacy, &node.identity.node_id, view).await,
            None => {
                election::campaign(
                    session,
                    &node.identity.election_keys,
                    shard,
                    &node.identity.node_id,
                    view,
                    &node.etcd.elections,
                )
                .await
            }
        }
    };
    tokio::select! {
        result = campaign => match result {
            Ok(leadership) => Campaigned::Leads(leadership),
            Err(err) => Campaigned::Failed(err),
        },
        _ = session.ended().cancelled() => Campaigned::SessionEnded,
    }
}

/// Leads the shard under `leadership` for as many terms as it lasts: a reload ends a term
/// between ticks and the next one leads on with the new jobs, without resigning. What the
/// leadership owes, and the retries of its runs, last as long as it does. False when the
/// shard's task ends: shutdown, the session's end, or a resignation that never got through.
async fn hold(
    node: &Arc<NodeContext>,
    session: &Session,
    fleet: &watch::Receiver<FleetView>,
    leadership: Leadership,
    jobs: &mut watch::Receiver<Arc<Loaded>>,
) -> bool {
    let shard = leadership.shard;
    let leading = session.ended().child_token();
    let _leading = leading.clone().drop_guard();
    let term = Term {
        identity: Arc::clone(&node.identity),
        mirrors: Arc::clone(&node.mirrors),
        work: Arc::clone(&node.work),
        shutdown: node.shutdown.clone(),
        session: session.clone(),
        fleet: fleet.clone(),
        starts: Arc::new(Starts::new(
            session.clone(),
            leading,
            Arc::clone(&node.work.started_here),
        )),
        leadership,
    };
    let mut known = Some(Book::new(Arc::clone(&node.work.job_gauges)));
    while let Some(book) = known.take() {
        let shard_jobs = jobs.borrow_and_update().by_shard[shard as usize].clone();
        tracing::info!(jobs = shard_jobs.len(), "leading shard");
        let shards_led = &crate::metrics::get().shards_led;
        shards_led.inc();
        let gauges = &node.work.job_gauges;
        gauges.leading(shard, shard_jobs.clone());
        let end = term.lead(shard_jobs, book, jobs.clone()).await;
        gauges.not_leading(shard);
        shards_led.dec();
        tracing::info!(reason = ?end, "term ended");
        match end {
            TermEnd::JobsReloaded(book) => known = Some(book),
            TermEnd::ShardCountGone(book) => known = Some(book.forgotten()),
            TermEnd::Deposed => {}
            TermEnd::HandedOff => return resign(node, session, &term.leadership).await,
            TermEnd::Stopped | TermEnd::SessionLost => return false,
        }
    }
    true
}

/// Resigns `leadership`, trying again until etcd confirms it; false if the session ended first.
/// Campaigning again with the key still there would lead again under the same term with an
/// empty book: the ticks the handed-off term owed would be neither fired nor adopted (claims
/// stamped with this term look like the new term's own), and its next write would drop them.
async fn resign(node: &NodeContext, session: &Session, leadership: &Leadership) -> bool {
    let mut backoff = Backoff::coordination();
    loop {
        match node.etcd.elections.request(election::resign(session, leadership)).await {
            Ok(()) => return true,
            Err(err) => {
                let wait = backoff.next_delay();
                if let Some(left_out) = repeats::log_now("resign failed") {
                    tracing::warn!(error = %err, retry_in = ?wait, left_out, "could not resign a handed-off shard; trying again before campaigning (left_out: lines like this one not logged since the last)");
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
async fn read_successes(
    client: etcd_client::Client,
    keys: crate::coord::keys::Keys,
    jobs: Vec<Arc<Job>>,
    gauges: Arc<crate::coord::job_gauges::JobGauges>,
) {
    if let Err(err) = crate::coord::job_gauges::read_successes(&client, &keys, &jobs, &gauges).await {
        tracing::debug!(error = %err, "cannot read the jobs' last successes; their gauges start from this node's runs");
    }
}
