//! The longest durations shardcron takes from anyone: `jobs.toml`, the command line and API
//! requests. Each is checked once where it comes in, so no later arithmetic on an instant can
//! overflow and no wait outlives any sensible use.

use std::time::Duration;

/// A span of time something covers: a plan's range, a pause, a job's timeout or starting
/// deadline. 100 years of 365.25 days.
pub const MAX_WINDOW: Duration = Duration::from_secs(36_525 * 86_400);

/// How long something waits before it acts: a kill's grace, a retry's backoff, the shutdown
/// grace, a trigger's timeout, the lease TTL.
pub const MAX_WAIT: Duration = Duration::from_secs(86_400);

/// Why a duration was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DurationError {
    #[error("{0} (examples: \"10s\", \"5m\", \"1h 30m\")")]
    Unreadable(#[from] humantime::DurationError),
    #[error("longer than the longest allowed, {}", humantime::format_duration(*.0))]
    TooLong(Duration),
}

/// Parses a duration such as `"10s"`, `"5m"` or `"1h 30m"` of at most `max`.
pub fn parse(text: &str, max: Duration) -> Result<Duration, DurationError> {
    let duration = humantime::parse_duration(text.trim())?;
    if duration > max {
        return Err(DurationError::TooLong(max));
    }
    Ok(duration)
}

/// A window ([`MAX_WINDOW`] at most), for clap.
pub fn window(text: &str) -> Result<Duration, DurationError> {
    parse(text, MAX_WINDOW)
}

/// A wait ([`MAX_WAIT`] at most), for clap.
pub fn wait(text: &str) -> Result<Duration, DurationError> {
    parse(text, MAX_WAIT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_past_their_bound_are_refused_with_the_bound() {
        assert_eq!(window("100y"), Ok(MAX_WINDOW));
        assert_eq!(
            parse("2s", Duration::from_secs(1)),
            Err(DurationError::TooLong(Duration::from_secs(1)))
        );
        assert_eq!(wait(" 1d "), Ok(MAX_WAIT));
        for (text, parsed, message) in [
            (
                "300000000000y",
                window("300000000000y"),
                "longer than the longest allowed, 100years",
            ),
            (
                "265000y",
                window("265000y"),
                "longer than the longest allowed, 100years",
            ),
            ("1d 1s", wait("1d 1s"), "longer than the longest allowed, 1day"),
            ("soon", wait("soon"), "expected number at 0 (examples"),
        ] {
            let err = parsed.expect_err(text).to_string();
            assert!(err.contains(message), "{text}: {err}");
        }
    }
}
