//! Serving what a node knows: the HTTP listener with its probes, metrics page, JSON API and
//! dashboard ([`http`]), what `shardcron status` reads and prints ([`status`]), and telling
//! systemd ([`systemd`]).
//!
//! May import: `rules`, `coord`, `running` and the shared leaves at the top. Never the leader
//! or the node: a node fills [`http::Exposure`] for the API.

pub mod http;
pub mod status;
pub mod systemd;
