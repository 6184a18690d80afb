//! A node's copy of an etcd prefix, read whole once and kept current by a watch for as long as
//! the session lasts: how every node sees pauses and run requests without polling.

use std::sync::Arc;

use etcd_client::{EventType, WatchOptions};

use crate::backoff::{sleep_or_cancel, Backoff};
use crate::coord::etcd::{self, CoordError};
use crate::coord::keys::Keys;
use crate::coord::session::Session;

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

/// A mirror as a node's list of them holds it, whatever it mirrors: [`Mirror`] names its prefix
/// through its type, so the list holds this instead.
pub(crate) trait AnyMirror: Send + Sync {
    /// [`load`]: reads the whole prefix; the read's revision.
    fn load_whole(
        self: Arc<Self>,
        client: etcd_client::Client,
        keys: Keys,
    ) -> BoxFuture<'static, Result<i64, CoordError>>;

    /// [`keep`]: keeps the mirror current from `read` until the session ends.
    fn keep_current(self: Arc<Self>, session: Session, keys: Keys, read: i64) -> BoxFuture<'static, ()>;
}

type BoxFuture<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;

impl<M: Mirror> AnyMirror for M {
    fn load_whole(
        self: Arc<Self>,
        client: etcd_client::Client,
        keys: Keys,
    ) -> BoxFuture<'static, Result<i64, CoordError>> {
        Box::pin(async move { load(&client, &keys, self.as_ref()).await })
    }

    fn keep_current(self: Arc<Self>, session: Session, keys: Keys, read: i64) -> BoxFuture<'static, ()> {
        Box::pin(keep(session, keys, self, read))
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
                    // A watch that fails once an hour waits the first step again, not the
                    // cap that failures long ago reached: pauses are seen late while it waits.
                    backoff.reset();
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
        // Cancelled because its revision was compacted: the caller reads the prefix again.
        if etcd::compacted(&response, M::WHAT)?.is_some() {
            return Ok(());
        }
        for event in response.events() {
            let Some(kv) = event.kv() else { continue };
            let put = (event.event_type() == EventType::Put).then(|| Put::of(kv));
            mirror.apply(keys, kv.key(), put);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Mutex;
    use std::time::Duration;

    use tokio_util::sync::CancellationToken;

    use super::*;

    /// Every key under `/m/` and its value.
    #[derive(Default)]
    struct Held(Mutex<BTreeMap<Vec<u8>, Vec<u8>>>);

    impl Mirror for Held {
        const WHAT: &'static str = "test keys";

        fn prefix(_: &Keys) -> String {
            "/m/".into()
        }

        fn clear(&self) {
            self.0.lock().unwrap().clear();
        }

        fn apply(&self, _: &Keys, key: &[u8], put: Option<Put>) {
            let mut held = self.0.lock().unwrap();
            match put {
                Some(put) => held.insert(key.to_vec(), put.value.to_vec()),
                None => held.remove(key),
            };
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_mirror_whose_revision_etcd_compacted_reads_its_prefix_again_and_goes_on() {
        let etcd = crate::etcd_server::EtcdServer::start(&crate::etcd_server::test_etcd_bin()).expect("etcd");
        let client = etcd_client::Client::connect([etcd.client_url()], None)
            .await
            .expect("client");
        let session = Session::open(&client, Duration::from_secs(5), &CancellationToken::new())
            .await
            .expect("session");
        let keys = Keys::new("c");
        client.clone().put("/m/a", "1", None).await.expect("put");
        let read = client.clone().put("/m/b", "1", None).await.expect("put");
        let read = read.header().expect("header").revision();
        // Changes after the mirror's read, then a compaction past them: its watch must start
        // from a revision etcd no longer holds.
        client.clone().put("/m/a", "2", None).await.expect("put");
        let deleted = client.clone().delete("/m/b", None).await.expect("delete");
        client
            .clone()
            .compact(deleted.header().expect("header").revision(), None)
            .await
            .expect("compact");
        let mirror = Arc::new(Held::default());
        mirror.apply(&keys, b"/m/a", Some(Put { value: b"1", lease: 0 }));
        mirror.apply(&keys, b"/m/b", Some(Put { value: b"1", lease: 0 }));
        tokio::spawn(keep(session.clone(), keys.clone(), Arc::clone(&mirror), read));
        client.clone().put("/m/c", "3", None).await.expect("put");
        let want: BTreeMap<Vec<u8>, Vec<u8>> =
            [(b"/m/a".to_vec(), b"2".to_vec()), (b"/m/c".to_vec(), b"3".to_vec())].into();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while *mirror.0.lock().unwrap() != want {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the mirror holds {:?}",
                mirror.0.lock().unwrap()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        session.close().await;
    }
}
