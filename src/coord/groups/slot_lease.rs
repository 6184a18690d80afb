//! The lease a node's group slots, places in line and listed runs live on: one at a time, a new
//! one opened when it lapses. Readers never wait for it: a run of an `overlap = "skip"` or
//! `"replace"` job asks for it as it starts, and an answer of "none" leaves that run unlisted, so
//! a reader must not be told "none" only because another task is checking or opening the lease
//! at that moment (correctness M5).

use std::sync::Mutex;
use std::time::Duration;

use etcd_client::Client;
use tokio_util::sync::CancellationToken;

use crate::coord::etcd::CoordError;
use crate::coord::session::{Purpose, Session};

pub(crate) struct SlotLease {
    current: Mutex<Option<Session>>,
    /// Held while a lease is opened, so that two callers do not open two.
    opening: tokio::sync::Mutex<()>,
}

impl SlotLease {
    pub(crate) fn new() -> SlotLease {
        SlotLease {
            current: Mutex::new(None),
            opening: tokio::sync::Mutex::new(()),
        }
    }

    fn current(&self) -> std::sync::MutexGuard<'_, Option<Session>> {
        self.current.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The lease now, if the node holds one that is live by its clock; never waits.
    pub(crate) fn live(&self) -> Option<Session> {
        self.current().as_ref().filter(|session| session.is_live()).cloned()
    }

    /// The live lease, else a new one: granted on `client` with `ttl`, kept alive until `until`.
    pub(crate) async fn live_or_open(
        &self,
        client: &Client,
        ttl: Duration,
        until: &CancellationToken,
    ) -> Result<Session, CoordError> {
        if let Some(session) = self.live() {
            return Ok(session);
        }
        let _opening = self.opening.lock().await;
        // Another caller may have opened one while this one waited its turn.
        if let Some(session) = self.live() {
            return Ok(session);
        }
        let session = Session::open_for(client, ttl, until, Purpose::Slots).await?;
        *self.current() = Some(session.clone());
        Ok(session)
    }

    /// The lease the node holds, live or not, taken out: no caller gets it after this.
    pub(crate) async fn take(&self) -> Option<Session> {
        let _opening = self.opening.lock().await;
        self.current().take()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::super::Groups;
    use super::*;
    use crate::coord::keys::Keys;
    use crate::etcd_server::EtcdServer;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_run_is_given_the_live_lease_while_a_group_attempt_checks_it() {
        let etcd = EtcdServer::start(&crate::etcd_server::test_etcd_bin()).expect("etcd");
        let client = Client::connect([etcd.client_url()], None).await.expect("client");
        let groups = Arc::new(Groups::new(
            client,
            Keys::new("c"),
            Duration::from_secs(5),
            Box::new(|_| None),
        ));
        let opened = groups.lease().await.expect("open");
        // Another caller has the turn to check or open the lease at this moment.
        let _checking = groups.lease.opening.lock().await;
        let listed_on = groups.lease_now().expect("the live lease, while an attempt checks it");
        assert_eq!(listed_on.lease(), opened.lease());
    }
}
