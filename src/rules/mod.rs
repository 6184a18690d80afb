//! The pure rules: what `jobs.toml` may say and the validated [`config::Config`] made from it,
//! when a schedule fires ([`schedule`], [`plan`], `spread` for `H`), which shard a job is in
//! ([`shard`]), which pool and election ([`pools`]), how many of a group's runs go at once ([`groups`]) and which node should lead it ([`assignment`]), which missed ticks a new leader
//! runs (`catch_up`), the bounds on every duration ([`bounds`]), and the values stored in etcd
//! ([`record`]: claims, run records and their outcomes, members) as plain data.
//!
//! May import: nothing of shardcron's outside this folder. No I/O, no clock: every function
//! takes the instant it decides about.

pub mod activity;
pub mod assignment;
pub mod backfill;
pub mod blackouts;
pub mod bounds;
pub(crate) mod catch_up;
pub mod config;
pub mod groups;
pub mod notify;
pub mod output;
pub mod own_secrets;
pub mod plan;
pub mod pools;
pub(crate) mod protocol;
pub mod record;
pub mod schedule;
pub mod shard;
pub(crate) mod spread;
pub mod suggest;
