//! The per-job gauges a shard's leader exports: when each job last succeeded, its next tick not
//! claimed yet, and the interval between its ticks.
//!
//! Only the node that leads a job's shard exports them, so a failover moves the series to the
//! new leader, which continues them from etcd: it reads each job's last success
//! (`/jobs/<job>/success`, written with every successful run's result) and learns the last
//! claimed tick from the records it reads anyway. The next run is the tick after the last one
//! claimed: while a leader is stuck it stays in the past, which is what "job late" alerts on.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use etcd_client::{Txn, TxnOp, TxnOpResponse};
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;

use crate::coord::etcd::ops_per_txn;
use crate::coord::etcd::{self, CoordError};
use crate::coord::keys::Keys;
use crate::rules::config::Job;
use crate::rules::record::RunRecord;

#[derive(Debug, Default)]
pub(crate) struct JobGauges {
    /// The jobs of each shard this node leads now.
    led: Mutex<HashMap<u32, Vec<Arc<Job>>>>,
    last_claimed: Mutex<HashMap<String, DateTime<Utc>>>,
    last_success: Mutex<HashMap<String, DateTime<Utc>>>,
    /// Only scrapes take this one.
    next_runs: Mutex<NextRuns>,
}

/// Keeps the newest of `at` and what `map` holds for `job`; allocates only for a job not seen.
fn keep_newest(map: &Mutex<HashMap<String, DateTime<Utc>>>, job: &str, at: DateTime<Utc>) {
    let mut map = map.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    match map.get_mut(job) {
        Some(held) if *held >= at => {}
        Some(held) => *held = at,
        None => {
            map.insert(job.to_string(), at);
        }
    }
}

impl JobGauges {
    /// The node's per-job gauges, on its metrics page from the start, before the node leads a
    /// shard: a scrape sees their descriptions as soon as the node runs.
    pub(crate) fn exported() -> Arc<JobGauges> {
        let gauges = Arc::new(JobGauges::default());
        crate::metrics::get().register_collector(Box::new(Collector(Arc::clone(&gauges))));
        gauges
    }

    /// This node leads `shard` with `jobs` from now on.
    pub(crate) fn leading(&self, shard: u32, jobs: Vec<Arc<Job>>) {
        self.led
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .insert(shard, jobs);
    }

    /// This node's term of `shard` ended: the shard's next leader exports its jobs' gauges. What
    /// this term knew is forgotten: should the node lead the shard again, it exports what etcd
    /// holds then, not its own older runs while it reads them (a takeover showed a last success
    /// one run old until its read of etcd answered).
    pub(crate) fn not_leading(&self, shard: u32) {
        let jobs = self
            .led
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .remove(&shard);
        for map in [&self.last_claimed, &self.last_success] {
            let mut map = map.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            for job in jobs.iter().flatten() {
                map.remove(&job.name);
            }
        }
    }

    pub(crate) fn claimed(&self, job: &str, tick: DateTime<Utc>) {
        keep_newest(&self.last_claimed, job, tick);
    }

    pub(crate) fn succeeded(&self, job: &str, finished_at: DateTime<Utc>) {
        keep_newest(&self.last_success, job, finished_at);
    }

    /// What a scrape needs of every job of the shards led now, read under the locks in one
    /// pass so that claims (which record their ticks here) wait for a copy, not for a render.
    fn snapshot(&self) -> Vec<Scraped> {
        let led = self.led.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let claimed = self
            .last_claimed
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let succeeded = self
            .last_success
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        led.values()
            .flatten()
            .map(|job| Scraped {
                job: Arc::clone(job),
                claimed: claimed.get(&job.name).copied(),
                succeeded: succeeded.get(&job.name).copied(),
            })
            .collect()
    }

    /// Writes the three gauges of every job of the shards led now, at `now`.
    fn encode(&self, mut encoder: DescriptorEncoder, now: DateTime<Utc>) -> Result<(), std::fmt::Error> {
        let jobs = self.snapshot();
        let seconds = |at: DateTime<Utc>| at.timestamp_millis() as f64 / 1000.0;
        let next_runs = self
            .next_runs
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .refresh(&jobs, now);
        encode_gauge(
            &mut encoder,
            "job_last_success_timestamp_seconds",
            "When the job's newest successful run finished (Unix time), exported by its shard's leader",
            jobs.iter()
                .filter_map(|seen| Some((seen.job.job_name(), seconds(seen.succeeded?)))),
        )?;
        encode_gauge(
            &mut encoder,
            "job_next_run_timestamp_seconds",
            "The job's next tick not claimed yet (Unix time); in the past while its leader is behind",
            jobs.iter()
                .zip(&next_runs)
                .filter_map(|(seen, next)| Some((seen.job.job_name(), seconds(next.next?)))),
        )?;
        encode_gauge(
            &mut encoder,
            "job_interval_seconds",
            "Seconds between the job's next two ticks",
            jobs.iter().zip(&next_runs).filter_map(|(seen, next)| {
                Some((seen.job.job_name(), next.interval?.num_milliseconds() as f64 / 1000.0))
            }),
        )?;
        Ok(())
    }
}

/// One led job as a scrape saw it.
struct Scraped {
    job: Arc<Job>,
    claimed: Option<DateTime<Utc>>,
    succeeded: Option<DateTime<Utc>>,
}

/// A job's next tick after `after`, and the time from it to the one after.
#[derive(Debug, Clone, Copy)]
struct NextRun {
    after: DateTime<Utc>,
    next: Option<DateTime<Utc>>,
    interval: Option<chrono::Duration>,
}

impl NextRun {
    fn of(job: &Job, after: DateTime<Utc>) -> NextRun {
        let next = job.schedule.next_after(after);
        let interval = next.and_then(|next| Some(job.schedule.next_after(next)? - next));
        NextRun { after, next, interval }
    }

    /// The next tick after any instant from `self.after` up to the tick itself is the same tick.
    fn holds_for(&self, after: DateTime<Utc>) -> bool {
        self.after <= after && self.next.is_some_and(|next| after < next)
    }
}

/// The next runs of the last scrape, by job: by the address of its config entry, which a reload
/// that changes the job replaces and which the map keeps alive, so no other job can take it.
/// Each scrape computes the schedule only of the jobs claimed since the last, not of all.
#[derive(Debug, Default)]
struct NextRuns(HashMap<usize, (Arc<Job>, NextRun)>);

impl NextRuns {
    /// The next run of each of `jobs` (in order) at `now`; forgets jobs no longer led.
    fn refresh(&mut self, jobs: &[Scraped], now: DateTime<Utc>) -> Vec<NextRun> {
        let mut kept = HashMap::with_capacity(jobs.len());
        let runs = jobs
            .iter()
            .map(|seen| {
                let key = Arc::as_ptr(&seen.job) as usize;
                let after = seen.claimed.unwrap_or(now);
                let run = match self.0.remove(&key) {
                    Some((_, run)) if run.holds_for(after) => run,
                    _ => NextRun::of(&seen.job, after),
                };
                kept.insert(key, (Arc::clone(&seen.job), run));
                run
            })
            .collect();
        self.0 = kept;
        runs
    }
}

/// One gauge family: `values` are (job, value) pairs.
fn encode_gauge<'j>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    values: impl Iterator<Item = (&'j str, f64)>,
) -> Result<(), std::fmt::Error> {
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (job, value) in values {
        ConstGauge::new(value).encode(family.encode_family(&[("job", job)].as_slice())?)?;
    }
    Ok(())
}

/// Registered with the node's metrics: renders [`JobGauges`] at each scrape.
#[derive(Debug)]
pub(crate) struct Collector(pub(crate) Arc<JobGauges>);

impl prometheus_client::collector::Collector for Collector {
    fn encode(&self, encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        self.0.encode(encoder, crate::clock::now())
    }
}

/// Learns the last success of each of `jobs` from etcd, for a new leader of their shard.
pub(crate) async fn read_successes(
    client: &etcd_client::Client,
    keys: &Keys,
    jobs: &[Arc<Job>],
    gauges: &JobGauges,
) -> Result<(), CoordError> {
    for chunk in jobs.chunks(ops_per_txn()) {
        let gets: Vec<TxnOp> = chunk
            .iter()
            .map(|job| TxnOp::get(keys.job_success(&job.name), None))
            .collect();
        let response = etcd::call(client.clone().txn(Txn::new().and_then(gets))).await?;
        for (job, op) in chunk.iter().zip(response.op_responses()) {
            let TxnOpResponse::Get(read) = op else {
                return Err(CoordError::Protocol("txn of gets answered with another op".into()));
            };
            let record = read
                .kvs()
                .first()
                .and_then(|kv| serde_json::from_slice::<RunRecord>(kv.value()).ok());
            if let Some(record) = record {
                gauges.succeeded(&job.name, record.finished_at);
            }
        }
        tokio::task::yield_now().await;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_jobs_of_led_shards_are_exported_and_the_next_run_follows_the_last_claim() {
        let gauges = Arc::new(JobGauges::default());
        let job = Arc::new(Job::for_tests("gauge-test", "*/10 * * * * *"));
        let at = |second: i64| DateTime::<Utc>::from_timestamp(1_800_000_000 + second, 0).unwrap();
        gauges.claimed("gauge-test", at(20));
        gauges.claimed("gauge-test", at(10));
        gauges.succeeded("gauge-test", at(12));
        let render = || {
            let mut registry = prometheus_client::registry::Registry::default();
            registry.register_collector(Box::new(Collector(Arc::clone(&gauges))));
            let mut text = String::new();
            prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
            text
        };
        assert!(
            !render().contains("gauge-test"),
            "a job of a shard not led is not exported"
        );
        gauges.leading(0, vec![Arc::clone(&job)]);
        let text = render();
        for line in [
            "job_last_success_timestamp_seconds{job=\"gauge-test\"} 1800000012.0",
            "job_next_run_timestamp_seconds{job=\"gauge-test\"} 1800000030.0",
            "job_interval_seconds{job=\"gauge-test\"} 10.0",
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
        gauges.not_leading(0);
        assert!(!render().contains("gauge-test"), "the next leader exports them");
        gauges.leading(0, vec![job]);
        assert!(
            !render().contains("job_last_success_timestamp_seconds{job=\"gauge-test\"}"),
            "leading again, the node exports no success from its earlier term"
        );
    }
}
