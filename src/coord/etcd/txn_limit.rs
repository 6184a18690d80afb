//! How many operations one transaction may hold: ours, or fewer when etcd's `--max-txn-ops`
//! is lower.

use std::sync::atomic::{AtomicUsize, Ordering};

use etcd_client::{Compare, CompareOp, Txn, TxnOp};

use super::calls::call;
use super::error::CoordError;
use crate::coord::keys::Keys;

/// etcd refuses transactions of more than 128 operations by default; a guard takes one.
pub const MAX_OPS_PER_TXN: usize = 100;

/// The fewest operations per transaction shardcron works with.
const MIN_OPS_PER_TXN: usize = 8;

/// How many records one transaction writes: [`MAX_OPS_PER_TXN`], or fewer when etcd's
/// `--max-txn-ops` is lower ([`learn_txn_limit`]).
static OPS_PER_TXN: AtomicUsize = AtomicUsize::new(MAX_OPS_PER_TXN);

/// How many records one transaction writes, a guard or two beside them.
pub fn ops_per_txn() -> usize {
    OPS_PER_TXN.load(Ordering::Relaxed)
}

/// Learns how many operations etcd takes in one transaction, with read-only transactions of
/// `n + 1` compares and `n + 1` reads of one key: an etcd started with a `--max-txn-ops` below
/// ours would otherwise refuse every full claim for ever. Called at each session's start.
pub async fn learn_txn_limit(client: &etcd_client::Client, keys: &Keys) -> Result<usize, CoordError> {
    let probe = keys.txn_probe();
    let accepts = |ops: usize| {
        let mut kv = client.kv_client();
        let txn = Txn::new()
            .when(vec![Compare::version(probe.as_str(), CompareOp::Equal, 0); ops + 1])
            .and_then(vec![TxnOp::get(probe.as_str(), None); ops + 1]);
        async move {
            match call(kv.txn(txn)).await {
                Ok(_) => Ok(true),
                Err(err) if err.is_too_many_ops() => Ok(false),
                Err(err) => Err(err),
            }
        }
    };
    let limit = if accepts(MAX_OPS_PER_TXN).await? {
        MAX_OPS_PER_TXN
    } else {
        // The largest count etcd takes, between the least we work with and ours.
        let (mut taken, mut refused) = (MIN_OPS_PER_TXN - 1, MAX_OPS_PER_TXN);
        while refused - taken > 1 {
            let middle = (taken + refused) / 2;
            if accepts(middle).await? {
                taken = middle;
            } else {
                refused = middle;
            }
        }
        if taken < MIN_OPS_PER_TXN {
            return Err(CoordError::Protocol(format!(
                "etcd takes fewer than {} operations in a transaction (its --max-txn-ops): shardcron needs at least that many",
                MIN_OPS_PER_TXN + 1
            )));
        }
        tracing::warn!(records = taken, ours = MAX_OPS_PER_TXN, "etcd takes fewer operations in a transaction than shardcron writes (its --max-txn-ops is low): claims write fewer records each");
        taken
    };
    OPS_PER_TXN.store(limit, Ordering::Relaxed);
    Ok(limit)
}
