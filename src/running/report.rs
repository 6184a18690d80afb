//! Where every finished run goes. A run of this node, a tick it recorded without a run
//! (skipped, paused, replaced, lost, group full) and a tick a takeover records lost for an
//! earlier leader all pass through [`Reports`], built once per node from its list of sinks; each
//! sink sees every one, in the list's order.
//!
//! Adding a sink: a type implementing [`RunSink`], in its own module, and one line in the list
//! `node::run` builds.

use std::sync::Arc;

use chrono::{DateTime, Utc};

use crate::coord::activity::ActivityCount;
use crate::coord::job_gauges::JobGauges;
use crate::coord::results::ResultQueue;
use crate::metrics::Metrics;
use crate::rules::config::Job;
use crate::rules::record::RunRecord;
use crate::running::notifications::Outbox;
use crate::running::runner::{Arrival, Tick};

/// A finished run, as its sinks see it.
pub(crate) struct Finished<'a> {
    pub(crate) job: &'a Arc<Job>,
    pub(crate) record: &'a RunRecord,
    /// How the tick came to this node, when this node ran it or recorded it without a run;
    /// `None` for a tick a takeover records lost for an earlier leader, whose record and
    /// history entry that takeover has written already.
    pub(crate) arrival: Option<&'a Arrival>,
}

/// One place a finished run goes.
pub(crate) trait RunSink: Send + Sync {
    fn finished(&self, run: &Finished<'_>);

    /// A takeover leaves `count` missed ticks of `job` unrun, the newest at `newest`.
    fn missed(&self, _job: &Arc<Job>, _count: usize, _newest: DateTime<Utc>, _fence: i64) {}
}

/// Every sink of the node's finished runs. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Reports {
    sinks: Arc<[Arc<dyn RunSink>]>,
}

impl Reports {
    pub(crate) fn new(sinks: Vec<Arc<dyn RunSink>>) -> Reports {
        Reports { sinks: sinks.into() }
    }

    /// `tick` of this node ended as `record`: run, or recorded without a run.
    pub(crate) fn ran(&self, tick: &Tick, record: &RunRecord) {
        self.each(&Finished {
            job: &tick.job,
            record,
            arrival: Some(&tick.arrival),
        });
    }

    /// A tick an earlier leader claimed and never started, recorded lost by this node's
    /// takeover (which wrote the record itself, before its claim).
    pub(crate) fn recorded_lost(&self, job: &Arc<Job>, record: &RunRecord) {
        self.each(&Finished {
            job,
            record,
            arrival: None,
        });
    }

    /// A takeover leaves `count` missed ticks of `job` unrun (`catch_up`, `starting_deadline`),
    /// the newest at `newest`.
    pub(crate) fn missed(&self, job: &Arc<Job>, count: usize, newest: DateTime<Utc>, fence: i64) {
        tracing::info!(job = %job.name, count, newest = %crate::clock::rfc3339(newest), "missed ticks a takeover does not run (catch_up, starting_deadline): told to the job's notifiers");
        for sink in self.sinks.iter() {
            sink.missed(job, count, newest, fence);
        }
    }

    fn each(&self, run: &Finished<'_>) {
        for sink in self.sinks.iter() {
            sink.finished(run);
        }
    }
}

/// `shardcron_runs_total` and the run duration histogram.
impl RunSink for &'static Metrics {
    fn finished(&self, run: &Finished<'_>) {
        self.record_run(run.job.job_name(), run.record);
    }
}

/// The node's runs per minute, for the dashboard's fleet strip.
impl RunSink for ActivityCount {
    fn finished(&self, run: &Finished<'_>) {
        self.record(run.record);
    }
}

/// The job's last success, in the gauges this node exports.
impl RunSink for JobGauges {
    fn finished(&self, run: &Finished<'_>) {
        if run.record.succeeded() {
            self.succeeded(&run.job.name, run.record.finished_at);
        }
    }
}

/// The job's notifications and success ping.
impl RunSink for Outbox {
    fn finished(&self, run: &Finished<'_>) {
        self.ran(run.job, run.record);
    }

    fn missed(&self, job: &Arc<Job>, count: usize, newest: DateTime<Utc>, fence: i64) {
        Outbox::missed(self, job, count, newest, fence);
    }
}

/// The run's result and history entry, to be written to etcd; then the answer to the client
/// that asked for it by hand, written only after what waits in the queue, so a command told how
/// its run ended finds it in `history` and `status`.
impl RunSink for ResultQueue {
    fn finished(&self, run: &Finished<'_>) {
        let Some(arrival) = run.arrival else { return };
        self.push_run(run.job, run.record.clone());
        if let Some(request) = arrival.request() {
            self.answer(request, run.record.clone());
        }
    }
}
