//! shardcron's scenario tests, in one binary: the harness and every scenario compile and link
//! once, instead of once per scenario file. Each scenario starts its own etcd on free loopback
//! ports (the packet-drop ones on 198.18.0.0/15 addresses of veth pairs they make, which needs
//! root) and runs the built `shardcron` binary as its nodes. The fault scenarios (lease stall,
//! split brain, etcd faults, bad commands, delivery, security, chaos, control, etcd space, packet
//! drops) print every figure they measure, for the table of faults in docs/faults.md; `scripts/test` runs
//! them a second time on etcd 3.5.1 (`SHARDCRON_TEST_ETCD`).
//!
//! ```text
//! cargo test --test main                       # every scenario
//! cargo test --test main scenarios::fleet::    # one scenario file
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
