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
    /// The file with every job's tables blanked out (newlines kept, so lines stay where they
    /// were): `[cluster]`, `[etcd]` and anything else.
    pub(super) rest: String,
    /// Byte ranges of the file, each holding whole jobs' tables and nothing else.
    pub(super) jobs: Vec<Range<usize>>,
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
    let mut rest = text.as_bytes().to_vec();
    let mut jobs: Vec<Range<usize>> = Vec::new();
    let mut jobs_in_last = 0;
    let mut seen: HashSet<&str> = HashSet::new();
    let mut current: Option<&str> = None;
    for (index, header) in headers.iter().enumerate() {
        let end = headers.get(index + 1).map_or(text.len(), |next| next.start);
        let Some(job) = header.job.as_deref() else {
            current = None;
            continue;
        };
        let new_job = current != Some(job);
        if new_job && !seen.insert(job) {
            return None;
        }
        current = Some(job);
        for byte in &mut rest[header.start..end] {
            if *byte != b'\n' {
                *byte = b' ';
            }
        }
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
    let rest = String::from_utf8(rest).ok()?;
    Some(Pieces { rest, jobs })
}

/// Every table header of `text`, in order, or `None` if one is not a plain `[a.b.c]` header.
fn headers(text: &str) -> Option<Vec<Header>> {
    let source = toml_parser::Source::new(text);
    let tokens: Vec<Token> = source.lex().collect();
    let mut headers = Vec::new();
    let mut line_start = true;
    // Brackets and braces open inside a value: a `[` there starts an array, not a table.
    let mut depth = 0usize;
    let mut index = 0;
    while index < tokens.len() {
        let token = &tokens[index];
        match token.kind() {
            TokenKind::Newline => {
                line_start = true;
                index += 1;
                continue;
            }
            TokenKind::Whitespace | TokenKind::Comment => {
                index += 1;
                continue;
            }
            TokenKind::LeftSquareBracket if line_start && depth == 0 => {
                let (job, after) = header(text, &tokens, index)?;
                headers.push(Header {
                    start: token.span().start(),
                    job,
                });
                index = after;
                line_start = false;
                continue;
            }
            TokenKind::LeftSquareBracket | TokenKind::LeftCurlyBracket if !line_start || depth > 0 => depth += 1,
            TokenKind::RightSquareBracket | TokenKind::RightCurlyBracket => depth = depth.checked_sub(1)?,
            _ => {}
        }
        line_start = false;
        index += 1;
    }
    Some(headers)
}

/// Reads the header whose `[` is `tokens[open]`: the job it belongs to, and the index after its
/// `]`.
fn header(text: &str, tokens: &[Token], open: usize) -> Option<(Option<String>, usize)> {
    let mut keys: Vec<String> = Vec::new();
    let mut index = open + 1;
    loop {
        let token = tokens.get(index)?;
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
        index += 1;
    }
    let job = match keys.first().map(String::as_str) {
        Some("jobs") => Some(keys.get(1)?.clone()),
        Some(_) => None,
        None => return None,
    };
    Some((job, index + 1))
}
