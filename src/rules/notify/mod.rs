//! Notifications: which runs of a job are worth telling someone about, and what is kept in etcd
//! so that each is told once across nodes that die.
//!
//! An event is a transition, not every run: the first failure after a success (`failure`), the
//! first success after a failure (`recovered`), and each `lost`, `skipped` or `group_full` run.
//! The job's notification record says whether the job is failing, the fence of the last run it
//! accounted for, the events not yet delivered and the last one that was; a run is accounted
//! for once, by its fence, so a record written twice never makes two events.
//!
//! Pure: what etcd holds and the instant are passed in.
//!
//! # Layout
//!
//! - [`notifier`]: who is told, of which events, at which URL.
//! - [`record`]: what etcd keeps per job until each event is delivered.
//! - [`account`]: how a run becomes events, and the record stays bounded.
//! - [`body`]: what a receiver is sent.

mod account;
mod body;
mod notifier;
mod record;

pub use account::{account, account_missed, kept, trim};
pub use body::{Body, SEND_TIMEOUT};
pub use notifier::{check_url, url_origin, Event, HeaderValue, Notifier, PingMethod, MAX_HEADERS, MAX_NOTIFIERS};
pub use record::{
    Pending, Record, Sent, DELIVERY_PATIENCE, MAX_BODY_OUTPUT, MAX_PENDING, MAX_RECORD_BYTES, SHORT_OUTPUT,
};
