//! shardcron's scenario tests, in one binary: the harness and every scenario compile and link
//! once, instead of once per scenario file. Each scenario starts its own etcd on free loopback
//! ports and runs the built `shardcron` binary as its nodes.
//!
//! ```text
//! cargo test --test main                       # every scenario
//! cargo test --test main scenarios::fleet::    # one scenario file
//! ```

mod support;

mod scenarios {
    mod cli;
    mod core;
    mod dev;
    mod faults;
    mod fleet;
    mod operations;
    mod security;
}
