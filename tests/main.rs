//! shardcron's scenario tests, in one binary: the harness and every scenario compile and link
//! once, instead of once per scenario file. Each scenario starts its own etcd on free loopback
//! ports (the packet-drop ones on 198.18.0.0/15 addresses of veth pairs they make, which needs
//! root) and runs the built `shardcron` binary as its nodes. A scenario that injects a fault is
//! declared with `on_both_etcds!` and runs as `<name>::etcd34` and `<name>::etcd35`, on the etcd
//! on the PATH and on 3.5.1 (`tests/support/etcds.rs`); the fault scenarios print every figure
//! they measure, for the table of faults in docs/faults.md.
//!
//! ```text
//! cargo test --test main                       # every scenario
//! cargo test --test main scenarios::fleet::    # one scenario file
//! cargo test --test main etcd34                # the fault scenarios on etcd 3.4 only
//! ```

mod support;

mod scenarios {
    mod backfill;
    mod bad_commands;
    mod census;
    mod chaos;
    mod cli;
    mod control;
    mod core;
    mod dashboard;
    mod delivery;
    mod etcd_faults;
    mod etcd_maintenance;
    mod etcd_space;
    mod fleet;
    mod groups;
    mod hostile_clients;
    mod http;
    mod lease_stall;
    mod notify;
    mod observability;
    mod operations;
    mod output;
    mod overlap;
    mod package;
    mod packet_drops;
    mod pools;
    mod read_path;
    mod run_kinds;
    mod secrets;
    mod security;
    mod shard_count;
    mod snapshots;
    mod split_brain;
    mod tour;
    mod upgrade;
}
