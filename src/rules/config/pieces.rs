//! A large `jobs.toml` read a thousand jobs at a time.
//!
//! Deserializing the whole file at once first builds a tree of the entire document: for
//! 100,000 jobs that tree is about 250 MB, 28 times the text. A file whose jobs are each written
//! as their own `[jobs.NAME]` tables (sub-tables such as `[jobs.NAME.env]` right after) can
//! instead be read in pieces: the other tables on their own, then runs of whole jobs, each piece
//! a small document. [`split`] finds the table headers with the TOML lexer, so a `[` inside a
//! string or an array value is never taken for one. Any file it does not recognise, and any
//! error, goes to the whole-document reader, which owns every error message.

use std::collections::HashSet;
use std::ops::Range;

use toml_parser::lexer::{Token, TokenKind};

/// Jobs per piece: small enough that a piece's tree is a few hundred kilobytes.
pub(super) const JOBS_PER_PIECE: usize = 1000;

/// A file split for reading in pieces.
pub(super) struct Pieces {
    /// The file without its jobs' tables: `[cluster]`, `[etcd]` and anything else. Its lines
    /// are not the file's, which is fine: any error sends the file to the whole-document reader.
    /// (Blanked out instead, 100,000 jobs left half a million empty lines, whose tokens cost the
    /// TOML reader 80 MB.)
    pub(super) rest: String,
    /// Byte ranges of the file, each holding whole jobs' tables and nothing else.
    pub(super) jobs: Vec<Range<usize>>,
    /// How many jobs the pieces hold together.
    pub(super) job_count: usize,
}

/// Where a table header starts, and the job it belongs to (`None`: not a job's table).
struct Header {
    start: usize,
    job: Option<String>,
}

/// Splits `text` into pieces, or `None` if the whole-document reader must read it: a `[jobs]`
/// table, an array of tables, a job's tables not written together, or a header this reader
/// does not need to understand.
pub(super) fn split(text: &str, jobs_per_piece: usize) -> Option<Pieces> {
    let headers = headers(text)?;
    let mut rest = String::from(&text[..headers.first().map_or(text.len(), |first| first.start)]);
    let mut jobs: Vec<Range<usize>> = Vec::new();
    let mut jobs_in_last = 0;
    let mut seen: HashSet<&str> = HashSet::new();
    let mut current: Option<&str> = None;
    for (index, header) in headers.iter().enumerate() {
        let end = headers.get(index + 1).map_or(text.len(), |next| next.start);
        let Some(job) = header.job.as_deref() else {
            rest.push_str(&text[header.start..end]);
            current = None;
            continue;
        };
        let new_job = current != Some(job);
        if new_job && !seen.insert(job) {
            return None;
        }
        current = Some(job);
        match jobs.last_mut() {
            Some(piece) if piece.end == header.start && (!new_job || jobs_in_last < jobs_per_piece) => {
                piece.end = end;
                jobs_in_last += usize::from(new_job);
            }
            _ => {
                jobs.push(header.start..end);
                jobs_in_last = 1;
            }
        }
    }
    Some(Pieces {
        rest,
        jobs,
        job_count: seen.len(),
    })
}

/// Every table header of `text`, in order, or `None` if one is not a plain `[a.b.c]` header.
/// The lexer's tokens are taken one at a time: collected, a 100,000-job file's would be the
/// largest thing a node ever holds (about 100 MB).
fn headers(text: &str) -> Option<Vec<Header>> {
    let source = toml_parser::Source::new(text);
    let mut tokens = source.lex();
    let mut headers = Vec::new();
    let mut line_start = true;
    // Brackets and braces open inside a value: a `[` there starts an array, not a table.
    let mut depth = 0usize;
    while let Some(token) = tokens.next() {
        match token.kind() {
            TokenKind::Newline => {
                line_start = true;
                continue;
            }
            TokenKind::Whitespace | TokenKind::Comment => continue,
            TokenKind::LeftSquareBracket if line_start && depth == 0 => {
                headers.push(Header {
                    start: token.span().start(),
                    job: header(text, &mut tokens)?,
                });
                line_start = false;
                continue;
            }
            TokenKind::LeftSquareBracket | TokenKind::LeftCurlyBracket if !line_start || depth > 0 => depth += 1,
            TokenKind::RightSquareBracket | TokenKind::RightCurlyBracket => depth = depth.checked_sub(1)?,
            _ => {}
        }
        line_start = false;
    }
    Some(headers)
}

/// Reads a header whose `[` `tokens` has just given, through its `]`: the job it belongs to.
fn header(text: &str, tokens: &mut impl Iterator<Item = Token>) -> Option<Option<String>> {
    let mut keys: Vec<String> = Vec::new();
    loop {
        let token = tokens.next()?;
        let raw = &text[token.span().start()..token.span().end()];
        match token.kind() {
            TokenKind::Whitespace | TokenKind::Dot => {}
            TokenKind::Atom => keys.push(raw.to_string()),
            TokenKind::LiteralString => keys.push(raw.strip_prefix('\'')?.strip_suffix('\'')?.to_string()),
            // Escapes are for the whole-document reader to decode.
            TokenKind::BasicString if !raw.contains('\\') => {
                keys.push(raw.strip_prefix('"')?.strip_suffix('"')?.to_string())
            }
            TokenKind::RightSquareBracket => break,
            _ => return None,
        }
    }
    match keys.first().map(String::as_str) {
        Some("jobs") => Some(Some(keys.get(1)?.clone())),
        Some(_) => Some(None),
        None => None,
    }
}
