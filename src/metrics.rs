//! Prometheus metrics of this node; [`crate::serving::http`] serves them at `/metrics`.
//!
//! The metrics are process-wide, like the log: every part of the node counts into the one
//! [`Metrics`] that [`get`] returns, whether or not `--http-addr` serves them.

use std::sync::{Mutex, OnceLock};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::rules::record::{Outcome, RunRecord};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct JobLabel {
    pub job: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct BlackoutLabel {
    pub blackout: String,
}

/// How a notification or a ping went: `delivered`, `failed` (an attempt), `gave_up`,
/// `dropped` (past the bound of undelivered events).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ResultLabel {
    pub result: &'static str,
}

impl JobLabel {
    pub fn new(job: &str) -> Self {
        JobLabel { job: job.to_string() }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RunLabels {
    pub job: String,
    /// `success`, `failure`, `timeout`, `replaced`, `killed`, `spawn_failed`, `skipped`, `lost`,
    /// `paused` or `group_full`.
    pub result: String,
}

/// Why a node lost its session: `renewal_timed_out` (no renewal answered within the TTL),
/// `expired_by_own_clock` (found past the TTL by a check of the node's own clock) or
/// `lease_gone` (etcd answered that the lease expired or is unknown).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct CauseLabel {
    pub cause: &'static str,
}

/// An etcd member, as scheme, host and port: never the userinfo a URL may carry.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct EndpointLabel {
    pub endpoint: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: String,
    tzdb: String,
}

/// Every metric the node exports. A leaf: the parts that own a value register it here (a
/// collector, a count read at each render); this module imports none of them.
pub(crate) struct Metrics {
    /// Locked to add a collector after start, and at each render.
    registry: Mutex<Registry>,
    /// Counts the pauses in force, set by the node that mirrors them.
    pauses: OnceLock<Box<dyn Fn() -> usize + Send + Sync>>,
    pub runs: Family<RunLabels, Counter>,
    /// Not by job: a histogram per job would be a dozen series for each of 100,000 jobs.
    pub run_duration: Histogram,
    pub lateness: Histogram,
    pub retries: Family<JobLabel, Counter>,
    pub shards_led: Gauge,
    pub claim_failures: Counter,
    pub catch_up_runs: Counter,
    pub skipped_overlaps: Counter,
    pub session_losses: Counter,
    pub session_losses_by_cause: Family<CauseLabel, Counter>,
    /// Per etcd member: 0 healthy, 1 suspect, 2 down.
    pub etcd_member_state: Family<EndpointLabel, Gauge>,
    /// Per etcd member: 1 for the one this node's calls go to first.
    pub etcd_member_preferred: Family<EndpointLabel, Gauge>,
    pub etcd_errors: Counter,
    /// Spawns that failed with EMFILE or ENFILE: the descriptor table was full.
    pub spawn_descriptor_exhausted: Counter,
    pub triggered_runs: Family<JobLabel, Counter>,
    /// Ticks recorded `skipped` because a blackout covered them, by blackout.
    pub blackout_skips: Family<BlackoutLabel, Counter>,
    /// Notification attempts by how they went.
    pub notifications: Family<ResultLabel, Counter>,
    /// Success pings by how they went.
    pub pings: Family<ResultLabel, Counter>,
    pub runs_in_flight: Gauge,
    /// Finished runs whose result, or whose history entry, is not in etcd yet.
    pub results_unwritten: Gauge,
    pub history_unwritten: Gauge,
    /// As this node's fleet view sees the elections.
    pub shards_without_leader: Gauge,
    pub jobs_without_eligible_node: Gauge,
    /// Candidate keys in the elections that no live member put, as this node's view sees them.
    pub election_foreign_keys: Gauge,
    pub config_drift_nodes: Gauge,
    /// etcd's database size, the part of it in use, and its quota, as `etcd_space` last read
    /// them; the quota stays 0 where etcd does not say it.
    pub etcd_db_bytes: Gauge,
    pub etcd_db_in_use_bytes: Gauge,
    pub etcd_quota_bytes: Gauge,
    /// 1 while etcd's NOSPACE alarm is raised: every write, every claim, is refused.
    pub etcd_nospace: Gauge,
    /// Counted from the node's mirror of the pauses when the page is rendered: a pause ends
    /// by itself at its `until`, with no event.
    pauses_in_force: Gauge,
    /// Follows the log writer's own count, read when the page is rendered.
    log_lines_dropped: Counter,
}

impl Metrics {
    fn new() -> Metrics {
        let mut registry = Registry::with_prefix("shardcron");
        let metrics = Metrics {
            runs: Family::default(),
            // 10 ms to about 5.8 hours.
            run_duration: Histogram::new(exponential_buckets(0.01, 4.0, 12)),
            // 0.5 ms to about 4 s.
            lateness: Histogram::new(exponential_buckets(0.0005, 2.0, 14)),
            retries: Family::default(),
            shards_led: Gauge::default(),
            claim_failures: Counter::default(),
            catch_up_runs: Counter::default(),
            skipped_overlaps: Counter::default(),
            session_losses: Counter::default(),
            session_losses_by_cause: Family::default(),
            etcd_member_state: Family::default(),
            etcd_member_preferred: Family::default(),
            etcd_errors: Counter::default(),
            spawn_descriptor_exhausted: Counter::default(),
            triggered_runs: Family::default(),
            blackout_skips: Family::default(),
            notifications: Family::default(),
            pings: Family::default(),
            runs_in_flight: Gauge::default(),
            results_unwritten: Gauge::default(),
            history_unwritten: Gauge::default(),
            shards_without_leader: Gauge::default(),
            jobs_without_eligible_node: Gauge::default(),
            election_foreign_keys: Gauge::default(),
            config_drift_nodes: Gauge::default(),
            etcd_db_bytes: Gauge::default(),
            etcd_db_in_use_bytes: Gauge::default(),
            etcd_quota_bytes: Gauge::default(),
            etcd_nospace: Gauge::default(),
            pauses_in_force: Gauge::default(),
            log_lines_dropped: Counter::default(),
            registry: Mutex::default(),
            pauses: OnceLock::new(),
        };
        // Exported from the start, at 0: an alert on their increase sees the first one.
        for result in ["delivered", "failed", "gave_up", "dropped"] {
            metrics.notifications.get_or_create(&ResultLabel { result }).inc_by(0);
        }
        for result in ["delivered", "failed", "dropped"] {
            metrics.pings.get_or_create(&ResultLabel { result }).inc_by(0);
        }
        metrics.register_runs(&mut registry);
        metrics.register_node(&mut registry);
        metrics.register_etcd(&mut registry);
        Metrics {
            registry: Mutex::new(registry),
            ..metrics
        }
    }

    /// The runs and what decides them. The order of registration is the order of the page.
    fn register_runs(&self, registry: &mut Registry) {
        registry.register("runs", "Finished runs by job and result", self.runs.clone());
        registry.register(
            "run_duration_seconds",
            "How long each run took",
            self.run_duration.clone(),
        );
        registry.register(
            "firing_lateness_seconds",
            "How late after its tick an on-time run was started",
            self.lateness.clone(),
        );
        registry.register("retries", "Retried attempts, by job", self.retries.clone());
        registry.register("shards_led", "Shards this node leads now", self.shards_led.clone());
        registry.register(
            "claim_failures",
            "Tick claims that etcd rejected",
            self.claim_failures.clone(),
        );
        registry.register(
            "catch_up_runs",
            "Missed ticks run by a new leader",
            self.catch_up_runs.clone(),
        );
        registry.register(
            "skipped_overlaps",
            "Ticks skipped because the job was still running (overlap = \"skip\")",
            self.skipped_overlaps.clone(),
        );
        registry.register(
            "session_losses",
            "Times this node lost its etcd lease",
            self.session_losses.clone(),
        );
        registry.register(
            "session_losses_by_cause",
            "Times this node lost its etcd lease, by cause: renewal_timed_out, expired_by_own_clock, lease_gone",
            self.session_losses_by_cause.clone(),
        );
        registry.register(
            "etcd_member_state",
            "How each etcd member answers this node's probes: 0 healthy, 1 suspect (late or refused once), 2 down",
            self.etcd_member_state.clone(),
        );
        registry.register(
            "etcd_member_preferred",
            "1 for the etcd member this node's calls go to first, 0 for the others",
            self.etcd_member_preferred.clone(),
        );
        registry.register(
            "etcd_errors",
            "etcd calls that failed or timed out, and answers that could not be used (an unreadable claim record, a short reply)",
            self.etcd_errors.clone(),
        );
        registry.register(
            "spawn_descriptor_exhausted",
            "Runs that could not start because the node or the system was out of file descriptors",
            self.spawn_descriptor_exhausted.clone(),
        );
        registry.register(
            "blackout_skips",
            "Ticks recorded skipped because a blackout covered them, by blackout",
            self.blackout_skips.clone(),
        );
        registry.register(
            "notifications",
            "Notification attempts by result: delivered, failed (an attempt; retried), gave_up (after 10 minutes), dropped (past the bound of undelivered events of a job)",
            self.notifications.clone(),
        );
        registry.register(
            "pings",
            "Success pings (ping_url) by result: delivered, failed",
            self.pings.clone(),
        );
        registry.register(
            "triggered_runs",
            "Runs asked for with shardcron trigger that this node claimed and started, by job",
            self.triggered_runs.clone(),
        );
    }

    /// The node's own state: pauses, logs, runs in flight, what waits to be written, and the
    /// elections and members as it sees them.
    fn register_node(&self, registry: &mut Registry) {
        registry.register(
            "pauses_in_force",
            "Pauses in force as this node sees them (a pause of every job counts once)",
            self.pauses_in_force.clone(),
        );
        registry.register(
            "log_lines_dropped",
            "Log lines dropped because the log's destination did not keep up",
            self.log_lines_dropped.clone(),
        );
        registry.register(
            "runs_in_flight",
            "Commands running on this node now",
            self.runs_in_flight.clone(),
        );
        registry.register(
            "results_unwritten",
            "Jobs whose newest result waits to be written to etcd (by a claim, or on its own)",
            self.results_unwritten.clone(),
        );
        registry.register(
            "history_unwritten",
            "Finished runs waiting to be added to their jobs' history in etcd",
            self.history_unwritten.clone(),
        );
        registry.register(
            "shards_without_leader",
            "Shards with no leader, as this node's view of the elections sees them",
            self.shards_without_leader.clone(),
        );
        registry.register(
            "jobs_without_eligible_node",
            "Jobs whose run_on tags no live node has all of, as this node's view of the members sees them: nobody runs them",
            self.jobs_without_eligible_node.clone(),
        );
        registry.register(
            "election_foreign_keys",
            "Keys in the shard elections that no live member put (no lease, or a lease no member holds); they never lead",
            self.election_foreign_keys.clone(),
        );
        registry.register(
            "config_drift_nodes",
            "Live nodes whose jobs.toml digest differs from this node's",
            self.config_drift_nodes.clone(),
        );
    }

    /// etcd's space, and the build.
    fn register_etcd(&self, registry: &mut Registry) {
        registry.register(
            "etcd_db_bytes",
            "Size of etcd's database file, as its endpoint status says",
            self.etcd_db_bytes.clone(),
        );
        registry.register(
            "etcd_db_in_use_bytes",
            "Part of etcd's database file in use (the rest is freed by a defragmentation)",
            self.etcd_db_in_use_bytes.clone(),
        );
        registry.register(
            "etcd_quota_bytes",
            "etcd's --quota-backend-bytes, past which it raises NOSPACE (0 if etcd does not say it)",
            self.etcd_quota_bytes.clone(),
        );
        registry.register(
            "etcd_nospace",
            "1 while etcd's NOSPACE alarm is raised and it refuses every write",
            self.etcd_nospace.clone(),
        );
        let build_info = Family::<BuildLabels, Gauge>::default();
        build_info
            .get_or_create(&BuildLabels {
                version: env!("CARGO_PKG_VERSION").to_string(),
                tzdb: chrono_tz::IANA_TZDB_VERSION.to_string(),
            })
            .set(1);
        registry.register(
            "build_info",
            "The shardcron version and the IANA time zone database compiled into it",
            build_info,
        );
    }

    /// Counts a finished (or skipped) run.
    pub fn record_run(&self, job: &str, record: &RunRecord) {
        let result = match (record.outcome, record.exit_code) {
            (Outcome::Exited, Some(0)) => "success",
            (Outcome::Exited, _) => "failure",
            (other, _) => other.as_str(),
        };
        self.runs
            .get_or_create(&RunLabels {
                job: job.to_string(),
                result: result.to_string(),
            })
            .inc();
        if !matches!(record.outcome, Outcome::Skipped | Outcome::Paused | Outcome::GroupFull) {
            self.run_duration.observe(record.duration_ms as f64 / 1000.0);
        }
    }

    /// Adds metrics that `collector` renders at each scrape, after every metric of its own.
    pub(crate) fn register_collector(&self, collector: Box<dyn prometheus_client::collector::Collector>) {
        self.registry
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .register_collector(collector);
    }

    /// Makes `shardcron_pauses_in_force` follow `in_force`, asked at each render: a pause ends by
    /// itself at its `until`, with no event to count. The first node of a process sets it.
    pub(crate) fn count_pauses(&self, in_force: impl Fn() -> usize + Send + Sync + 'static) {
        let _ = self.pauses.set(Box::new(in_force));
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        if let Some(drops) = LOG_DROPS.get() {
            let dropped = drops.dropped_lines() as u64;
            let counted = self.log_lines_dropped.get();
            if dropped > counted {
                self.log_lines_dropped.inc_by(dropped - counted);
            }
        }
        if let Some(in_force) = self.pauses.get() {
            self.pauses_in_force.set(in_force() as i64);
        }
        let mut text = String::new();
        let registry = self.registry.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Err(err) = prometheus_client::encoding::text::encode(&mut text, &registry) {
            tracing::warn!(error = %err, "cannot encode metrics");
        }
        text
    }
}

static LOG_DROPS: OnceLock<tracing_appender::non_blocking::ErrorCounter> = OnceLock::new();

/// Makes `shardcron_log_lines_dropped_total` follow the log writer's count of dropped lines.
pub fn count_log_drops(drops: tracing_appender::non_blocking::ErrorCounter) {
    let _ = LOG_DROPS.set(drops);
}

/// The node's metrics.
pub(crate) fn get() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(Metrics::new)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_are_counted_by_job_and_result() {
        let record = |outcome: Outcome, exit_code: Option<i32>| RunRecord {
            scheduled_at: chrono::DateTime::UNIX_EPOCH,
            fence: 1,
            node: "n".into(),
            outcome,
            exit_code,
            duration_ms: 20,
            finished_at: chrono::DateTime::UNIX_EPOCH,
            attempts: 1,
            trigger: crate::rules::record::Trigger::Schedule,
            output: None,
            blackout: None,
        };
        let metrics = Metrics::new();
        metrics.record_run("metrics-test", &record(Outcome::Exited, Some(0)));
        metrics.record_run("metrics-test", &record(Outcome::Exited, Some(2)));
        metrics.record_run("metrics-test", &record(Outcome::Timeout, None));
        let text = metrics.render();
        for line in [
            "shardcron_runs_total{job=\"metrics-test\",result=\"success\"} 1",
            "shardcron_runs_total{job=\"metrics-test\",result=\"failure\"} 1",
            "shardcron_runs_total{job=\"metrics-test\",result=\"timeout\"} 1",
            "shardcron_run_duration_seconds_count 3",
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
    }
}
