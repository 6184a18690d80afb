//! Prometheus metrics of this node, and the small HTTP endpoint that serves them.
//!
//! The metrics are process-wide, like the log: every part of the node counts into the one
//! [`Metrics`] that [`get`] returns, whether or not `--metrics-addr` serves them.

use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use crate::record::{Outcome, RunRecord};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct JobLabel {
    pub job: String,
}

impl JobLabel {
    pub fn new(job: &str) -> Self {
        JobLabel { job: job.to_string() }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RunLabels {
    pub job: String,
    /// `success`, `failure`, `timeout`, `replaced`, `killed`, `spawn_failed`, `skipped` or `lost`.
    pub result: String,
}

/// Every metric the node exports.
pub(crate) struct Metrics {
    registry: Registry,
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
    pub etcd_errors: Counter,
    pub triggered_runs: Family<JobLabel, Counter>,
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
            etcd_errors: Counter::default(),
            triggered_runs: Family::default(),
            pauses_in_force: Gauge::default(),
            log_lines_dropped: Counter::default(),
            registry: Registry::default(),
        };
        registry.register("runs", "Finished runs by job and result", metrics.runs.clone());
        registry.register(
            "run_duration_seconds",
            "How long each run took",
            metrics.run_duration.clone(),
        );
        registry.register(
            "firing_lateness_seconds",
            "How late after its tick an on-time run was started",
            metrics.lateness.clone(),
        );
        registry.register("retries", "Retried attempts, by job", metrics.retries.clone());
        registry.register("shards_led", "Shards this node leads now", metrics.shards_led.clone());
        registry.register(
            "claim_failures",
            "Tick claims that etcd rejected",
            metrics.claim_failures.clone(),
        );
        registry.register(
            "catch_up_runs",
            "Missed ticks run by a new leader",
            metrics.catch_up_runs.clone(),
        );
        registry.register(
            "skipped_overlaps",
            "Ticks skipped because the job was still running (overlap = \"skip\")",
            metrics.skipped_overlaps.clone(),
        );
        registry.register(
            "session_losses",
            "Times this node lost its etcd lease",
            metrics.session_losses.clone(),
        );
        registry.register(
            "etcd_errors",
            "etcd calls that failed or timed out",
            metrics.etcd_errors.clone(),
        );
        registry.register(
            "triggered_runs",
            "Runs asked for with shardcron trigger that this node claimed and started, by job",
            metrics.triggered_runs.clone(),
        );
        registry.register(
            "pauses_in_force",
            "Pauses in force as this node sees them (a pause of every job counts once)",
            metrics.pauses_in_force.clone(),
        );
        registry.register(
            "log_lines_dropped",
            "Log lines dropped because the log's destination did not keep up",
            metrics.log_lines_dropped.clone(),
        );
        Metrics { registry, ..metrics }
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
        if !matches!(record.outcome, Outcome::Skipped | Outcome::Paused) {
            self.run_duration.observe(record.duration_ms as f64 / 1000.0);
        }
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
        if let Some(pauses) = PAUSES.get() {
            self.pauses_in_force.set(pauses.in_force(crate::clock::now()) as i64);
        }
        let mut text = String::new();
        if let Err(err) = prometheus_client::encoding::text::encode(&mut text, &self.registry) {
            tracing::warn!(error = %err, "cannot encode metrics");
        }
        text
    }
}

static LOG_DROPS: OnceLock<tracing_appender::non_blocking::ErrorCounter> = OnceLock::new();

static PAUSES: OnceLock<std::sync::Arc<crate::pauses::Pauses>> = OnceLock::new();

/// Makes `shardcron_pauses_in_force` count the pauses of this node's mirror.
pub(crate) fn count_pauses(pauses: std::sync::Arc<crate::pauses::Pauses>) {
    let _ = PAUSES.set(pauses);
}

/// Makes `shardcron_log_lines_dropped_total` follow the log writer's count of dropped lines.
pub fn count_log_drops(drops: tracing_appender::non_blocking::ErrorCounter) {
    let _ = LOG_DROPS.set(drops);
}

/// The node's metrics.
pub(crate) fn get() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(Metrics::new)
}

/// Serves `GET /metrics` on `listener` until `shutdown`.
pub async fn serve(listener: TcpListener, shutdown: CancellationToken) {
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(err) => {
                    tracing::warn!(error = %err, "metrics endpoint: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = shutdown.cancelled() => return,
        };
        tokio::spawn(async move {
            if let Err(err) = answer(stream).await {
                tracing::debug!(%peer, error = %err, "metrics request failed");
            }
        });
    }
}

/// Binds the metrics endpoint, so a bad address fails the start rather than a later request.
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// Answers one HTTP/1.x request. The request head is read up to 8 KiB within 5 s; anything but
/// `GET /metrics` is a 404.
async fn answer(mut stream: TcpStream) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(512);
    let mut buffer = [0u8; 1024];
    let read_head = async {
        while !head.windows(4).any(|window| window == b"\r\n\r\n") && head.len() < 8 * 1024 {
            let read = stream.read(&mut buffer).await?;
            if read == 0 {
                break;
            }
            head.extend_from_slice(&buffer[..read]);
        }
        Ok::<(), std::io::Error>(())
    };
    tokio::time::timeout(Duration::from_secs(5), read_head)
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "request head not sent within 5 s"))??;
    let request_line = head.split(|&byte| byte == b'\r').next().unwrap_or_default();
    let mut parts = request_line.split(|&byte| byte == b' ');
    let (method, path) = (parts.next().unwrap_or_default(), parts.next().unwrap_or_default());
    let path = path.split(|&byte| byte == b'?').next().unwrap_or_default();
    let (status, content_type, body) = if method == b"GET" && path == b"/metrics" {
        // With many jobs a page is large; building it must not hold up a runtime thread that
        // fires ticks.
        let page = tokio::task::spawn_blocking(|| get().render()).await.unwrap_or_default();
        (
            "200 OK",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            page,
        )
    } else {
        (
            "404 Not Found",
            "text/plain; charset=utf-8",
            "try GET /metrics\n".to_string(),
        )
    };
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    // A scraper that stops reading must not hold the page forever.
    tokio::time::timeout(Duration::from_secs(10), async {
        stream.write_all(response.as_bytes()).await?;
        stream.shutdown().await
    })
    .await
    .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "response not read within 10 s"))?
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
            trigger: crate::record::Trigger::Schedule,
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
