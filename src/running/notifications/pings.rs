//! A success's ping: one request to the job's `ping_url`, never retried, with a bound on the
//! pings in flight past which a ping is dropped and counted.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::webhook::describe;
use super::{count, Outbox, PINGS_IN_FLIGHT};
use crate::rules::notify::{url_origin, PingMethod};

impl Outbox {
    /// Pings `url` for a success of `job` from a task of its own; with [`PINGS_IN_FLIGHT`]
    /// already waiting for their answer (or no webhook client) the ping is dropped and counted.
    pub(super) fn ping(&self, job: &str, url: &str, method: PingMethod) {
        let pings = &crate::metrics::get().pings;
        let permit = match (&self.http, Arc::clone(&self.pings).try_acquire_owned()) {
            (Some(http), Ok(permit)) => (http.clone(), permit),
            (http, _) => {
                count(pings, "dropped");
                if let Some(left_out) = crate::repeats::log_now("ping dropped") {
                    match http {
                        Some(_) => tracing::warn!(job, in_flight = PINGS_IN_FLIGHT, left_out, "success ping dropped: too many pings wait for their answer (left_out: lines like this one not logged since the last)"),
                        None => tracing::warn!(job, left_out, "success ping dropped: this node has no webhook client (left_out: lines like this one not logged since the last)"),
                    }
                }
                return;
            }
        };
        let (http, permit) = permit;
        let (stop, job, url) = (self.stop.clone(), job.to_string(), url.to_string());
        self.tracker.spawn(async move {
            send_ping(http, stop, job, url, method).await;
            drop(permit);
        });
    }
}

/// Pings `url` once for a success of `job`: failures are logged and counted, never retried
/// (the next success pings again).
async fn send_ping(http: reqwest::Client, stop: CancellationToken, job: String, url: String, method: PingMethod) {
    let pings = &crate::metrics::get().pings;
    let request = match method {
        PingMethod::Get => http.get(&url),
        PingMethod::Post => http.post(&url),
    };
    let sent = tokio::select! {
        sent = request.send() => sent,
        _ = stop.cancelled() => return,
    };
    match sent {
        Ok(answer) if answer.status().is_success() => count(pings, "delivered"),
        Ok(answer) => {
            count(pings, "failed");
            tracing::warn!(job, url = url_origin(&url), status = %answer.status(), "success ping refused");
        }
        Err(err) => {
            count(pings, "failed");
            tracing::warn!(
                job,
                url = url_origin(&url),
                why = describe(&err),
                "success ping not delivered"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::metrics::ResultLabel;

    #[tokio::test]
    async fn success_pings_past_the_bound_in_flight_are_dropped_and_counted() {
        // Takes connections into its backlog and never answers: each ping waits its timeout.
        let stalled = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/ping", stalled.local_addr().unwrap());
        let outbox = Outbox::unread();
        let dropped = || {
            crate::metrics::get()
                .pings
                .get_or_create(&ResultLabel { result: "dropped" })
                .get()
        };
        let before = dropped();
        for _ in 0..PINGS_IN_FLIGHT + 3 {
            outbox.ping("often", &url, PingMethod::Get);
        }
        assert_eq!(outbox.tracker.len(), PINGS_IN_FLIGHT);
        assert_eq!(dropped() - before, 3);
        outbox.stop.cancel();
        outbox.tracker.close();
        tokio::time::timeout(Duration::from_secs(5), outbox.tracker.wait())
            .await
            .expect("stopped pings end");
        outbox.ping("often", &url, PingMethod::Get);
        assert_eq!(dropped() - before, 3, "room again once they ended");
    }
}
