//! Config errors, one table per part of the file: each names the line, the job and the field,
//! and says what is wrong.
//!
//! - `job`: a job's schedule, fields, policies, durations and retries.
//! - `cluster`: the file's syntax, `[cluster]`, job names and `[etcd]`.

mod cluster;
mod job;

use super::*;

/// One error kind: (file text, expected line, job, field, a fragment of the message).
type ErrorCase = (
    String,
    Option<usize>,
    Option<&'static str>,
    Option<&'static str>,
    &'static str,
);

/// Checks that each case's file is refused with its line, job, field and message.
fn assert_errors(cases: Vec<ErrorCase>) {
    for (text, line, job, field, fragment) in cases {
        let err = parse_str(&text)
            .err()
            .unwrap_or_else(|| panic!("expected an error for:\n{text}"));
        let shown = err.to_string();
        assert_eq!(err.location.map(|(line, _)| line), line, "line of {shown}");
        if let Some(job) = job {
            assert_eq!(err.job.as_deref(), Some(job), "job of {shown}");
        }
        assert_eq!(err.field.as_deref(), field, "field of {shown}");
        assert!(shown.contains(fragment), "{shown:?} should contain {fragment:?}");
        assert!(shown.starts_with("jobs.toml:"), "{shown:?} should name the file");
    }
}

/// `.` and `..` are no names: a URL path normalises them away (`/api/v1/jobs/../pause`), so a
/// job so named could not be paused, resumed or shown from a browser. Names that merely hold
/// dots stay valid.
#[test]
fn dot_and_dot_dot_are_refused_as_names_of_every_table() {
    let table = |kind: &str, name: &str| match kind {
        "jobs" => format!("[jobs.\"{name}\"]\nschedule = \"* * * * *\"\ncommand = \"true\"\n"),
        "groups" => format!("[groups.\"{name}\"]\nlimit = 1\n"),
        "notify" => format!("[notify.\"{name}\"]\nurl = \"http://127.0.0.1:9/h\"\n"),
        _ => format!("[blackouts.\"{name}\"]\ndates = [\"2026-12-24\"]\n"),
    };
    for kind in ["jobs", "groups", "notify", "blackouts"] {
        for (name, refused) in [
            (".", true),
            ("..", true),
            ("...", false),
            (".a", false),
            ("a..b", false),
        ] {
            let text = format!("{HEAD}\n{}", table(kind, name));
            match (parse_str(&text), refused) {
                (Ok(_), false) => {}
                (Ok(_), true) => panic!("[{kind}.\"{name}\"] taken"),
                (Err(err), false) => panic!("[{kind}.\"{name}\"] refused: {err}"),
                (Err(err), true) => {
                    assert!(err.message.contains("invalid"), "{kind} {name}: {err}");
                    assert_eq!(err.location.map(|(line, _)| line), Some(10), "{kind} {name}: {err}");
                }
            }
        }
    }
}
