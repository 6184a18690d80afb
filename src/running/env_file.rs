//! A job's `env_file`: its secrets, read from a file private to the node's user at each run, so
//! they are never in `jobs.toml`, in etcd, or in the node's memory between runs.
//!
//! The format, one variable a line:
//! - `KEY=VALUE`; the key is letters, digits and `_`, not starting with a digit, and not a
//!   `CRON_*` name (shardcron sets those); spaces around the key are dropped, the value is
//!   everything after the first `=`, as written, spaces included.
//! - A value wholly inside one pair of `"` or `'` loses them; nothing in it is unescaped or
//!   expanded (no `$VAR`, no `\n`). A value cannot span lines.
//! - Blank lines and lines whose first non-blank character is `#` are skipped.
//! - At most [`MAX_SIZE`] bytes and [`MAX_VARS`] variables; UTF-8, no NUL byte.
//!
//! An error names the file and the line, never a value.

use std::path::Path;

use crate::secrets::{read_private_file, PrivateFileError, NOT_GROUP_OR_OTHERS};

/// The largest `env_file` read.
pub(crate) const MAX_SIZE: u64 = 64 * 1024;
/// The most variables an `env_file` may set.
pub(crate) const MAX_VARS: usize = 1000;

/// Why a run's `env_file` could not be used: the run is recorded `spawn_failed`.
#[derive(Debug, thiserror::Error)]
pub(crate) enum EnvFileError {
    #[error("env_file {path}: {source}")]
    Unreadable { path: String, source: PrivateFileError },
    #[error("env_file {path}: not UTF-8")]
    NotUtf8 { path: String },
    #[error("env_file {path}: line {line}: {problem}")]
    Line {
        path: String,
        line: usize,
        problem: &'static str,
    },
    #[error("env_file {path}: larger than {MAX_SIZE} bytes")]
    TooLarge { path: String },
    #[error("env_file {path}: more than {MAX_VARS} variables")]
    TooMany { path: String },
}

/// Reads and parses the `env_file` at `path`: its variables in file order (a key given twice:
/// the last wins, as a shell would have it).
pub(crate) fn read(path: &Path) -> Result<Vec<(String, String)>, EnvFileError> {
    let shown = path.display().to_string();
    let bytes = read_private_file(path, MAX_SIZE, NOT_GROUP_OR_OTHERS).map_err(|source| match source {
        PrivateFileError::TooLarge => EnvFileError::TooLarge { path: shown.clone() },
        source => EnvFileError::Unreadable {
            path: shown.clone(),
            source,
        },
    })?;
    let text = String::from_utf8(bytes).map_err(|_| EnvFileError::NotUtf8 { path: shown.clone() })?;
    parse(&text).map_err(|(line, problem)| match problem {
        Problem::TooMany => EnvFileError::TooMany { path: shown.clone() },
        Problem::Line(problem) => EnvFileError::Line {
            path: shown.clone(),
            line,
            problem,
        },
    })
}

enum Problem {
    Line(&'static str),
    TooMany,
}

/// The variables of an `env_file`'s text, or the 1-based line of the first problem.
fn parse(text: &str) -> Result<Vec<(String, String)>, (usize, Problem)> {
    let mut vars: Vec<(String, String)> = Vec::new();
    for (index, line) in text.split('\n').enumerate() {
        let number = index + 1;
        let line = line.strip_suffix('\r').unwrap_or(line);
        let trimmed = line.trim_start();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        if line.contains('\0') {
            return Err((number, Problem::Line("a NUL byte")));
        }
        let Some((key, value)) = line.split_once('=') else {
            return Err((number, Problem::Line("not KEY=VALUE")));
        };
        let key = key.trim();
        let plain = key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if key.is_empty() || !plain || key.as_bytes()[0].is_ascii_digit() {
            return Err((
                number,
                Problem::Line("the key must be letters, digits and '_', not starting with a digit"),
            ));
        }
        if key.starts_with("CRON_") {
            return Err((number, Problem::Line("CRON_* names are set by shardcron")));
        }
        let value = unquote(value);
        vars.retain(|(existing, _)| existing != key);
        if vars.len() == MAX_VARS {
            return Err((number, Problem::TooMany));
        }
        vars.push((key.to_string(), value.to_string()));
    }
    Ok(vars)
}

/// A value wholly inside one pair of the same quotes, without them.
fn unquote(value: &str) -> &str {
    for quote in ['"', '\''] {
        if let Some(inner) = value.strip_prefix(quote).and_then(|rest| rest.strip_suffix(quote)) {
            return inner;
        }
    }
    value
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn lines_become_variables() {
        let text = "# a comment\n\n  DB_URL=postgres://u:p@h/db?x=1\nQUOTED=\"a b \"\nSINGLE='$HOME'\nSPACED = kept \r\nEMPTY=\nDB_URL=second\n   # indented comment\n";
        let got = parse(text).map_err(|(line, _)| line).expect("valid");
        assert_eq!(
            got,
            vars(&[
                ("QUOTED", "a b "),
                ("SINGLE", "$HOME"),
                ("SPACED", " kept "),
                ("EMPTY", ""),
                ("DB_URL", "second"),
            ])
        );
        assert_eq!(
            parse("ONE=\"x'").map_err(|(line, _)| line).expect("valid"),
            vars(&[("ONE", "\"x'")])
        );
    }

    #[test]
    fn bad_lines_are_refused_by_line_number() {
        let cases = [
            ("OK=1\nno equals sign", 2),
            ("=value", 1),
            ("1ST=x", 1),
            ("BAD-KEY=x", 1),
            ("export KEY=x", 1),
            ("CRON_FENCE=1", 1),
            ("A=1\nB=x\0y", 2),
        ];
        for (text, line) in cases {
            match parse(text) {
                Err((got, Problem::Line(_))) => assert_eq!(got, line, "{text:?}"),
                _ => panic!("{text:?} was accepted"),
            }
        }
        let many: String = (0..=MAX_VARS).map(|i| format!("V{i}=x\n")).collect();
        assert!(matches!(parse(&many), Err((_, Problem::TooMany))));
    }

    #[test]
    fn a_file_others_may_read_is_refused_and_no_error_shows_a_value() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("job.env");
        std::fs::write(&path, "TOKEN=hunter2-secret\nbroken hunter2-secret\n").expect("write");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let err = read(&path).expect_err("mode").to_string();
        assert!(err.contains("mode 0644") && err.contains("job.env"), "{err}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        let err = read(&path).expect_err("line 2").to_string();
        assert!(err.contains("line 2") && !err.contains("hunter2"), "{err}");
        std::fs::write(&path, "TOKEN=hunter2-secret\n").expect("write");
        assert_eq!(read(&path).expect("valid"), vars(&[("TOKEN", "hunter2-secret")]));
        let err = read(&dir.path().join("missing.env")).expect_err("missing").to_string();
        assert!(err.contains("missing.env"), "{err}");
    }
}
