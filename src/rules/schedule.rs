//! Crontab schedules bound to a time zone.
//!
//! A [`Schedule`] is parsed once and answers one question: the first fire instant strictly after a
//! given instant. It is a pure function of (expression, zone, instant); nothing here reads the
//! clock, so callers and tests decide what "now" is.

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use croner::parser::{CronParser, Seconds, Year};
use croner::Cron;

use crate::rules::spread;

/// One or more parsed crontab expressions and the zone their wall-clock fields are read in. A
/// job with several expressions fires at every instant any of them matches, once per instant.
#[derive(Clone)]
pub struct Schedule {
    /// The expressions as they fire (nicknames and `H` expanded), joined by `" | "`.
    expanded: String,
    zone: Tz,
    crons: Vec<Cron>,
    /// The expanded expressions and zone as job records name them, made once: every claim
    /// writes it.
    label: String,
}

/// Separates the expressions of a schedule list wherever they are shown as one string.
const LIST_SEPARATOR: &str = " | ";

/// Why an expression cannot be used as a schedule.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ScheduleError {
    #[error("invalid schedule {expression:?}: {reason}")]
    Invalid { expression: String, reason: String },
    #[error("schedule {expression:?} never fires (no matching date within the search limit)")]
    NeverFires { expression: String },
    #[error("schedule {expression:?} uses H, whose values come from a job's name: name the job")]
    NeedsJob { expression: String },
    #[error("the schedule list is empty: give at least one expression")]
    Empty,
}

impl Schedule {
    /// Parses a 5-field crontab line, a 6-field line with leading seconds, or an `@nickname`.
    ///
    /// Day-of-month and day-of-week are ORed when both are restricted, as in Vixie cron. An
    /// expression that parses but can never fire (`0 0 31 2 *`) is an error here, so a job
    /// that would silently never run is refused at load time.
    pub fn parse(expression: &str, zone: Tz) -> Result<Self, ScheduleError> {
        Self::parse_for_job(&[expression], zone, None)
    }

    /// Parses a list of expressions for `job`, whose name gives the values of any `H` item (see
    /// [`crate::rules::spread`]); without a job, an `H` is an error.
    pub fn parse_for_job(expressions: &[&str], zone: Tz, job: Option<&str>) -> Result<Self, ScheduleError> {
        if expressions.is_empty() {
            return Err(ScheduleError::Empty);
        }
        let mut crons = Vec::with_capacity(expressions.len());
        let mut expanded = Vec::with_capacity(expressions.len());
        for expression in expressions {
            let (cron, fires_as) = parse_one(expression, job)?;
            crons.push(cron);
            expanded.push(fires_as);
        }
        let expanded = expanded.join(LIST_SEPARATOR);
        let schedule = Schedule {
            label: format!("{expanded} in {zone}"),
            expanded,
            zone,
            crons,
        };
        Ok(schedule)
    }

    /// The first fire instant strictly after `after`, or `None` if there is none.
    ///
    /// DST follows OCPS: a fixed-time job whose wall time falls in a spring-forward gap fires
    /// once right after the gap, one in a fall-back overlap fires once at the first occurrence;
    /// a job with a wildcard or step in its time fields fires by elapsed time.
    pub fn next_after(&self, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let local = after.with_timezone(&self.zone);
        self.crons
            .iter()
            .filter_map(|cron| cron.find_next_occurrence(&local, false).ok())
            .map(|next| next.with_timezone(&Utc))
            .min()
    }

    /// The last fire instant at or before `at`, or `None` if there is none.
    pub fn latest_at_or_before(&self, at: DateTime<Utc>) -> Option<DateTime<Utc>> {
        // Fire instants are whole seconds, so searching from `at`'s whole second finds the same
        // one. Given a fraction, croner's backward search can answer up to a second after `at`:
        // in the last second before the clock goes back, the repeated range's first instant.
        let at = DateTime::<Utc>::from_timestamp(at.timestamp(), 0)?;
        let local = at.with_timezone(&self.zone);
        self.crons
            .iter()
            .filter_map(|cron| cron.find_previous_occurrence(&local, true).ok())
            .map(|previous| previous.with_timezone(&Utc))
            .max()
    }

    /// The `n`-th newest fire instant at or before `at` (`n` = 1: the newest), or `None` if
    /// there are fewer.
    pub fn nth_newest_at_or_before(&self, at: DateTime<Utc>, n: usize) -> Option<DateTime<Utc>> {
        let mut cursor = self.latest_at_or_before(at)?;
        for _ in 1..n {
            cursor = self.latest_at_or_before(cursor - chrono::Duration::seconds(1))?;
        }
        Some(cursor)
    }

    /// Whether some expression's wall-clock fields match `at` read in the zone. False for an
    /// instant the schedule fires at only because its wall time fell in a DST gap.
    pub fn matches_wall_time(&self, at: DateTime<Utc>) -> bool {
        let local = at.with_timezone(&self.zone);
        self.crons
            .iter()
            .any(|cron| cron.is_time_matching(&local).unwrap_or(false))
    }

    /// The newest fire instants in `(after, until]`, oldest first, at most `limit` of them, and
    /// whether older ones in the range were left out. Walks backwards from `until`, so a record
    /// from long ago costs `limit` steps, not one per tick since.
    pub fn newest_ticks_between(
        &self,
        after: DateTime<Utc>,
        until: DateTime<Utc>,
        limit: usize,
    ) -> (Vec<DateTime<Utc>>, bool) {
        let mut ticks = Vec::new();
        let mut cursor = self.latest_at_or_before(until);
        while let Some(tick) = cursor.filter(|tick| *tick > after) {
            if ticks.len() == limit {
                ticks.reverse();
                return (ticks, true);
            }
            ticks.push(tick);
            cursor = self.latest_at_or_before(tick - chrono::Duration::seconds(1));
        }
        ticks.reverse();
        (ticks, false)
    }

    /// The expressions as they fire, nicknames and `H` expanded, joined by `" | "`.
    pub fn expanded(&self) -> &str {
        &self.expanded
    }

    pub fn zone(&self) -> Tz {
        self.zone
    }

    /// The expression and zone, as job records name the schedule that claimed a tick.
    pub fn label(&self) -> &str {
        &self.label
    }
}

impl fmt::Debug for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Schedule({:?} in {})", self.expanded, self.zone)
    }
}

/// One expression parsed, and the expression it fires as (nickname and `H` expanded).
fn parse_one(expression: &str, job: Option<&str>) -> Result<(Cron, String), ScheduleError> {
    let invalid = |reason: String| ScheduleError::Invalid {
        expression: expression.to_string(),
        reason,
    };
    let trimmed = expression.trim();
    let unnicknamed = expand_nickname(trimmed).map_err(invalid)?;
    let fires_as = if spread::uses_hash(unnicknamed) {
        let job = job.ok_or_else(|| ScheduleError::NeedsJob {
            expression: expression.to_string(),
        })?;
        spread::expand(unnicknamed, job).map_err(invalid)?
    } else {
        unnicknamed.to_string()
    };
    let fields = fires_as.split_whitespace().count();
    if fields != 5 && fields != 6 {
        return Err(invalid(format!(
            "expected 5 fields (minute hour day-of-month month day-of-week) \
             or 6 with leading seconds, found {fields}"
        )));
    }
    let cron = CronParser::builder()
        .seconds(Seconds::Optional)
        .year(Year::Disallowed)
        .dom_and_dow(false)
        .build()
        .parse(&fires_as)
        .map_err(|err| invalid(fields::explain(&fires_as).unwrap_or_else(|| err.to_string())))?;
    // A reference instant in the past keeps the check independent of today's date; a pattern
    // that matches nothing fails from any start.
    let reference = DateTime::<Utc>::from_timestamp(0, 0).unwrap_or_default();
    if cron.find_next_occurrence(&reference, false).is_err() {
        return Err(ScheduleError::NeverFires {
            expression: expression.to_string(),
        });
    }
    let fires_as = if trimmed.starts_with('@') {
        trimmed.to_string()
    } else {
        fires_as
    };
    Ok((cron, fires_as))
}

/// Vixie cron's `@` forms. Expanded here rather than by croner, whose expansion adds a year field.
fn expand_nickname(expression: &str) -> Result<&str, String> {
    if !expression.starts_with('@') {
        return Ok(expression);
    }
    match expression.to_ascii_lowercase().as_str() {
        "@yearly" | "@annually" => Ok("0 0 1 1 *"),
        "@monthly" => Ok("0 0 1 * *"),
        "@weekly" => Ok("0 0 * * 0"),
        "@daily" | "@midnight" => Ok("0 0 * * *"),
        "@hourly" => Ok("0 * * * *"),
        _ => Err(
            "unknown nickname (expected one of @yearly @annually @monthly @weekly @daily @midnight @hourly)"
                .to_string(),
        ),
    }
}

/// Parses an IANA zone name such as `Europe/Berlin`.
pub fn parse_zone(name: &str) -> Result<Tz, String> {
    Tz::from_str(name)
        .map_err(|_| format!("unknown time zone {name:?} (expected an IANA name such as \"Europe/Berlin\")"))
}

mod fields;
#[cfg(test)]
mod tests;

#[cfg(test)]
mod properties;
