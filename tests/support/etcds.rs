//! Which etcd a scenario runs on, and the rule that puts every fault on both etcd versions.
//!
//! A plain `#[test]` scenario runs on the packaged etcd: `SHARDCRON_TEST_ETCD`, else `etcd` on
//! the `PATH` (Debian's 3.4). A scenario declared with [`on_both_etcds!`] runs twice, as
//! `<name>::etcd34` on that etcd and as `<name>::etcd35` on 3.5.1 (`SHARDCRON_TEST_ETCD_3_5`,
//! else what `scripts/etcd-3.5` fetches once). Which scenarios run on both is not a list kept by
//! hand: the harness refuses a fault (a node signalled to stop, die or freeze, a proxy that cuts,
//! slows or holds etcd's replies, a namespace that drops packets) from a scenario that was not
//! declared on both, so a new fault scenario fails at once until it is.

use std::cell::Cell;
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

/// The etcd releases every fault scenario runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Etcd {
    /// `SHARDCRON_TEST_ETCD`, else `etcd` on the `PATH`: Debian's 3.4.
    Packaged,
    /// The official 3.5.1 build.
    V3_5,
}

thread_local! {
    /// The etcd of the scenario running on this thread, when it was declared on both.
    static DECLARED: Cell<Option<Etcd>> = const { Cell::new(None) };
}

/// Runs `scenario` as a scenario declared on both etcds, on `etcd`. Called by [`on_both_etcds!`].
pub fn run_on(etcd: Etcd, scenario: fn()) {
    DECLARED.with(|declared| declared.set(Some(etcd)));
    scenario();
}

/// Whether the scenario running on this thread was declared on both etcds. The harness's
/// objects (a world, a proxy, a namespace) read it when they are made, on the scenario's thread,
/// so a fault injected later from a thread of the scenario's own is judged by its scenario.
pub fn declared_on_both() -> bool {
    DECLARED.with(Cell::get).is_some()
}

/// Refuses `fault` unless the scenario that injects it runs on both etcds.
pub fn allow_fault(declared: bool, fault: &str) {
    assert!(
        declared,
        "this scenario injects a fault ({fault}) but is a plain #[test]: declare it with \
         on_both_etcds! {{ ... }} so it runs on etcd 3.4 and 3.5.1 (tests/support/etcds.rs)"
    );
}

/// The etcd binary the scenario on this thread starts.
pub fn etcd_bin() -> PathBuf {
    match DECLARED.with(Cell::get) {
        Some(Etcd::V3_5) => etcd_3_5_bin(),
        Some(Etcd::Packaged) | None => shardcron::etcd_server::test_etcd_bin(),
    }
}

/// etcd 3.5.1: `SHARDCRON_TEST_ETCD_3_5`, else fetched once per test run by `scripts/etcd-3.5`
/// (a cached copy when there is one). A scenario never falls back to another etcd: a missing
/// 3.5.1 fails it, saying how to get one.
fn etcd_3_5_bin() -> PathBuf {
    static BIN: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let bin = BIN.get_or_init(|| {
        if let Some(bin) = std::env::var_os("SHARDCRON_TEST_ETCD_3_5").filter(|bin| !bin.is_empty()) {
            return Ok(PathBuf::from(bin));
        }
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts/etcd-3.5");
        let out = Command::new(&script)
            .output()
            .map_err(|err| format!("{}: {err}", script.display()))?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
    });
    match bin {
        Ok(bin) => bin.clone(),
        Err(why) => panic!("no etcd 3.5.1 (set SHARDCRON_TEST_ETCD_3_5, or let scripts/etcd-3.5 fetch it): {why}"),
    }
}

/// Declares a scenario that runs on both etcd releases: `<name>::etcd34` and `<name>::etcd35`.
/// Its body sees the items of the module it is written in.
macro_rules! on_both_etcds {
    ($(#[$attr:meta])* fn $name:ident() $body:block) => {
        $(#[$attr])*
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            fn scenario() $body

            #[test]
            fn etcd34() {
                crate::support::etcds::run_on(crate::support::etcds::Etcd::Packaged, scenario);
            }

            #[test]
            fn etcd35() {
                crate::support::etcds::run_on(crate::support::etcds::Etcd::V3_5, scenario);
            }
        }
    };
}
pub(crate) use on_both_etcds;
