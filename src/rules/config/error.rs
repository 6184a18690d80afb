//! Config errors, located by file, line, column, job and field, and the source text that
//! locates them.

use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};

/// A config that cannot be used, located as precisely as the file allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub file: PathBuf,
    /// 1-based line and column, when the problem has a place in the file.
    pub location: Option<(usize, usize)>,
    pub job: Option<String>,
    pub field: Option<String>,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some((line, column)) = self.location {
            write!(f, ":{line}:{column}")?;
        }
        write!(f, ":")?;
        if let Some(job) = &self.job {
            write!(f, " job {job:?}")?;
        }
        if let Some(field) = &self.field {
            if self.job.is_some() {
                write!(f, ",")?;
            }
            write!(f, " field {field:?}")?;
        }
        if self.job.is_some() || self.field.is_some() {
            write!(f, ":")?;
        }
        write!(f, " {}", self.message)
    }
}

impl std::error::Error for ConfigError {}

/// The file being validated, for turning byte spans into line and column.
pub(super) struct Source<'a> {
    pub(super) path: &'a Path,
    pub(super) text: &'a str,
}

impl Source<'_> {
    pub(super) fn error(
        &self,
        span: Option<Range<usize>>,
        job: Option<&str>,
        field: Option<&str>,
        message: impl Into<String>,
    ) -> ConfigError {
        ConfigError {
            file: self.path.to_path_buf(),
            location: span.map(|span| self.line_column(span.start)),
            job: job.map(str::to_string),
            field: field.map(str::to_string),
            message: message.into(),
        }
    }

    pub(super) fn line_column(&self, offset: usize) -> (usize, usize) {
        let before = &self.text[..offset.min(self.text.len())];
        let line = before.matches('\n').count() + 1;
        let column = before.len() - before.rfind('\n').map_or(0, |newline| newline + 1) + 1;
        (line, column)
    }

    /// A TOML or shape error. The parser knows only a span, so the job and field are read back
    /// from the file: the nearest `[jobs.NAME]` header above, and the key on the error's line.
    pub(super) fn toml_error(&self, err: &toml::de::Error) -> ConfigError {
        let span = err.span();
        let offset = span.as_ref().map_or(0, |span| span.start);
        let (line, _) = self.line_column(offset);
        let lines: Vec<&str> = self.text.lines().collect();
        let job = lines[..line.min(lines.len())]
            .iter()
            .rev()
            .find_map(|line| job_header(line));
        let message = err.message().to_string();
        let field = backticked(&message)
            .filter(|_| message.starts_with("unknown field") || message.starts_with("missing field"))
            .or_else(|| lines.get(line - 1).and_then(|line| key_of(line)));
        let job = job.filter(|job| Some(job.as_str()) != field.as_deref());
        let suggestion = match (&field, message.split_once("expected one of")) {
            (Some(field), Some((_, expected))) if message.starts_with("unknown field") => {
                crate::rules::suggest::did_you_mean(field, expected.split('`').skip(1).step_by(2))
            }
            _ => String::new(),
        };
        ConfigError {
            file: self.path.to_path_buf(),
            location: span.map(|span| self.line_column(span.start)),
            job,
            field,
            message: format!("{}{suggestion}", message.trim()),
        }
    }
}

/// `NAME` of a `[jobs.NAME]` table header line.
fn job_header(line: &str) -> Option<String> {
    let inner = line.trim().strip_prefix('[')?.split(']').next()?.trim();
    let name = inner.strip_prefix("jobs.")?.trim();
    Some(name.trim_matches('"').to_string())
}

/// The key of a `key = value` line.
fn key_of(line: &str) -> Option<String> {
    let (key, _) = line.split_once('=')?;
    let key = key.trim();
    (!key.is_empty() && !key.starts_with('[') && !key.starts_with('#')).then(|| key.trim_matches('"').to_string())
}

fn backticked(message: &str) -> Option<String> {
    let start = message.find('`')? + 1;
    let len = message[start..].find('`')?;
    Some(message[start..start + len].to_string())
}
