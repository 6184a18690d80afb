//! The node's file descriptors: the limit it runs under, and whether a run lately could not
//! start for want of one.
//!
//! A run needs a few descriptors (its pipes, the spawn's own) at the moment it starts; HTTP
//! clients and etcd connections hold theirs for as long as they last. When the table is full,
//! runs fail with `spawn_failed` while everything else looks healthy, so the node raises its
//! soft limit as far as it may at start, the listener keeps to a share of it, and a spawn that
//! still hits the limit is counted and shown on `/readyz`.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};

/// How long after a spawn failed for want of descriptors `/readyz` still says so.
pub(crate) const EXHAUSTION_SHOWN_FOR: Duration = Duration::from_secs(60);

/// The soft `RLIMIT_NOFILE` before and after [`raise_limit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Raised {
    pub before: Option<u64>,
    pub now: Option<u64>,
    /// The hard limit; `None` is unlimited.
    pub hard: Option<u64>,
}

/// Raises the soft descriptor limit to the hard one: the default soft limit (often 1,024) is
/// a compatibility value for `select(2)` users, which the node is not. `None` in a limit means
/// unlimited.
pub fn raise_limit() -> Result<Raised, std::io::Error> {
    let limit = getrlimit(Resource::Nofile);
    let before = limit.current;
    if limit.current == limit.maximum {
        return Ok(Raised {
            before,
            now: before,
            hard: limit.maximum,
        });
    }
    setrlimit(
        Resource::Nofile,
        Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        },
    )?;
    Ok(Raised {
        before,
        now: getrlimit(Resource::Nofile).current,
        hard: limit.maximum,
    })
}

/// The soft descriptor limit the node runs under now; `None` is unlimited.
pub fn soft_limit() -> Option<u64> {
    getrlimit(Resource::Nofile).current
}

/// Whether `err` says the process (`EMFILE`) or the system (`ENFILE`) is out of descriptors.
pub(crate) fn is_exhaustion(err: &std::io::Error) -> bool {
    matches!(err.raw_os_error(), Some(libc::EMFILE | libc::ENFILE))
}

/// When a spawn last failed for want of descriptors. Process-wide like the limit it is about.
static LAST_EXHAUSTED: Mutex<Option<Instant>> = Mutex::new(None);

/// Notes that a spawn failed for want of descriptors just now.
pub(crate) fn note_exhaustion() {
    if let Ok(mut last) = LAST_EXHAUSTED.lock() {
        *last = Some(Instant::now());
    }
}

/// How long ago a spawn last failed for want of descriptors, if within
/// [`EXHAUSTION_SHOWN_FOR`].
pub(crate) fn recent_exhaustion() -> Option<Duration> {
    let last = (*LAST_EXHAUSTED.lock().ok()?)?;
    let ago = last.elapsed();
    (ago < EXHAUSTION_SHOWN_FOR).then_some(ago)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_emfile_and_enfile_are_exhaustion() {
        assert!(is_exhaustion(&std::io::Error::from_raw_os_error(libc::EMFILE)));
        assert!(is_exhaustion(&std::io::Error::from_raw_os_error(libc::ENFILE)));
        assert!(!is_exhaustion(&std::io::Error::from_raw_os_error(libc::ENOENT)));
        assert!(!is_exhaustion(&std::io::Error::other("no errno")));
    }

    #[test]
    fn an_exhaustion_is_recent_once_noted() {
        note_exhaustion();
        assert!(recent_exhaustion().is_some_and(|ago| ago < EXHAUSTION_SHOWN_FOR));
    }
}
