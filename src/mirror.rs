//! A node's copy of an etcd prefix, read whole once and kept current by a watch for as long as
//! the session lasts: how every node sees pauses and run requests without polling.

use std::sync::Arc;

use etcd_client::{EventType, WatchOptions};

use crate::backoff::{sleep_or_cancel, Backoff};
use crate::etcd::{self, CoordError};
use crate::keys::Keys;
use crate::session::Session;

/// What a node mirrors of one prefix.
pub(crate) trait Mirror: Send + Sync + 'static {
    /// What is mirrored, for the log.
    const WHAT: &'static str;

    fn prefix(keys: &Keys) -> String;

    /// Forgets everything, before a read of the whole prefix.
    fn clear(&self);

    /// A key was put (`Some`) or deleted (`None`).
    fn apply(&self, keys: &Keys, key: &[u8], put: Option<Put>);
}

/// A key's value as it was put, and the lease it lives on (0 for none).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Put<'a> {
    pub(crate) value: &'a [u8],
    pub(crate) lease: i64,
}

impl<'a> Put<'a> {
    fn of(kv: &'a etcd_client::KeyValue) -> Put<'a> {
        Put {
            value: kv.value(),
            lease: kv.lease(),
        }
    }
}

/// Reads the whole prefix into `mirror`, replacing what it held; returns the read's revision.
pub(crate) async fn load<M: Mirror>(client: &etcd_client::Client, keys: &Keys, mirror: &M) -> Result<i64, CoordError> {
    let (read, revision) = etcd::read_prefix(client, &M::prefix(keys)).await?;
    mirror.clear();
    for kv in &read {
        mirror.apply(keys, kv.key(), Some(Put::of(kv)));
    }
    Ok(revision)
}

/// Keeps `mirror` current from the revision `read` until the session ends, reading the whole
/// prefix again whenever the watch fails.
pub(crate) async fn keep<M: Mirror>(session: Session, keys: Keys, mirror: Arc<M>, mut read: i64) {
    let mut backoff = Backoff::coordination();
    loop {
        tokio::select! {
            result = watch(&session, &keys, mirror.as_ref(), read) => {
                if let Err(err) = result {
                    tracing::warn!(error = %err, what = M::WHAT, "watch failed; reading the whole prefix again");
                }
            }
            _ = session.ended().cancelled() => return,
        }
        loop {
            if !sleep_or_cancel(backoff.next_delay(), session.ended()).await {
                return;
            }
            match load(&session.client(), &keys, mirror.as_ref()).await {
                Ok(revision) => {
                    read = revision;
                    break;
                }
                Err(err) => tracing::warn!(error = %err, what = M::WHAT, "cannot read the prefix; retrying"),
            }
        }
    }
}

async fn watch<M: Mirror>(session: &Session, keys: &Keys, mirror: &M, read: i64) -> Result<(), CoordError> {
    let client = session.client();
    let mut stream = etcd::call(client.clone().watch(
        M::prefix(keys),
        Some(WatchOptions::new().with_prefix().with_start_revision(read + 1)),
    ))
    .await?;
    loop {
        let Some(response) = stream.message().await? else {
            return Ok(());
        };
        if response.canceled() {
            return Ok(());
        }
        for event in response.events() {
            let Some(kv) = event.kv() else { continue };
            let put = (event.event_type() == EventType::Put).then(|| Put::of(kv));
            mirror.apply(keys, kv.key(), put);
        }
    }
}
