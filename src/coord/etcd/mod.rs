//! Connecting to etcd, and the errors a coordination call can end in.

mod calls;
mod error;
mod read;
mod setup;
mod txn_limit;

pub use calls::probe;
pub(crate) use calls::{call, compacted, lease_gone, within, CALL_TIMEOUT};
pub use error::CoordError;
pub(crate) use read::{read_named, read_prefix, scan_prefix, PAGE};
pub(crate) use setup::connect;
pub use setup::{connect_options, SetupError};
pub use txn_limit::{learn_txn_limit, ops_per_txn, MAX_OPS_PER_TXN};

#[cfg(test)]
mod tests;
