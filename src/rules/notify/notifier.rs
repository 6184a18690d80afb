//! Who a notification goes to and what it may tell of: a validated `[notify.<name>]`, its
//! events, and the checks on its URL that config validation and the senders share.

use std::collections::BTreeSet;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// At most this many `[notify.<name>]` tables in a file.
pub const MAX_NOTIFIERS: usize = 64;
/// At most this many headers on one notifier.
pub const MAX_HEADERS: usize = 32;

/// What a notifier may be told about (`on = [...]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Event {
    /// The first failed run after a success (or the job's first run, failed).
    Failure,
    /// The first successful run after a failure.
    Recovered,
    /// Each tick recorded `lost`.
    Lost,
    /// Each tick recorded `skipped` (a run still going, a blackout).
    Skipped,
    /// Each tick recorded `group_full`.
    GroupFull,
    /// Ticks that passed while the job's shard had no leader and were not caught up.
    Missed,
}

impl Event {
    pub const ALL: [Event; 6] = [
        Event::Failure,
        Event::Recovered,
        Event::Lost,
        Event::Skipped,
        Event::GroupFull,
        Event::Missed,
    ];

    /// The default `on`.
    pub const DEFAULT: [Event; 3] = [Event::Failure, Event::Recovered, Event::Lost];

    pub fn as_str(self) -> &'static str {
        match self {
            Event::Failure => "failure",
            Event::Recovered => "recovered",
            Event::Lost => "lost",
            Event::Skipped => "skipped",
            Event::GroupFull => "group_full",
            Event::Missed => "missed",
        }
    }

    pub fn parse(text: &str) -> Option<Event> {
        Event::ALL.into_iter().find(|event| event.as_str() == text)
    }
}

/// `ping_method`: how a success ping is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum PingMethod {
    #[default]
    Get,
    Post,
}

/// A validated `[notify.<name>]`.
#[derive(Clone, PartialEq, Eq)]
pub struct Notifier {
    pub name: String,
    /// An `http://` or `https://` URL.
    pub url: String,
    pub headers: Vec<(String, HeaderValue)>,
    pub on: BTreeSet<Event>,
}

impl Notifier {
    /// The host this notifier sends header values read from the node's secrets (`env` or
    /// `file`) to over plain `http://`, unless it is this machine: anyone on the way reads them.
    pub fn secrets_in_the_clear(&self) -> Option<&str> {
        let rest = self.url.strip_prefix("http://")?;
        let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
        let host_port = authority.rsplit('@').next().unwrap_or_default();
        let host = match host_port.strip_prefix('[') {
            Some(bracketed) => bracketed.split(']').next().unwrap_or_default(),
            None => host_port.split(':').next().unwrap_or_default(),
        };
        let loopback = host.eq_ignore_ascii_case("localhost")
            || host
                .parse::<std::net::IpAddr>()
                .is_ok_and(|address| address.is_loopback());
        let secret = self
            .headers
            .iter()
            .any(|(_, value)| matches!(value, HeaderValue::Env(_) | HeaderValue::File(_)));
        (secret && !loopback).then_some(host)
    }

    /// What an operator should hear about this notifier without it being an error.
    pub fn warnings(&self) -> Vec<String> {
        self.secrets_in_the_clear()
            .map(|host| {
                format!(
                    "notifier {:?} sends header values from env or file over plain http:// to {host}: anyone on the way reads them; use https:// (a receiver with an internal CA: install that CA into the system's trust store, which nodes trust beside the public roots)",
                    self.name
                )
            })
            .into_iter()
            .collect()
    }
}

/// Where a header's value comes from; the value itself is never printed.
#[derive(Clone, PartialEq, Eq)]
pub enum HeaderValue {
    Text(String),
    /// The node's environment variable of this name, read at each send.
    Env(String),
    /// The whole file (its last newline cut), read at each send.
    File(PathBuf),
}

impl std::fmt::Debug for Notifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URL may hold a token (`https://hc-ping.com/<uuid>`), as the headers may.
        let headers: Vec<&str> = self.headers.iter().map(|(name, _)| name.as_str()).collect();
        f.debug_struct("Notifier")
            .field("name", &self.name)
            .field("headers", &headers)
            .field("on", &self.on)
            .finish_non_exhaustive()
    }
}

/// The URL with its path, query and credentials left out: what a log line may show.
pub fn url_origin(url: &str) -> &str {
    let after_scheme = url.find("://").map_or(0, |at| at + 3);
    let end = url[after_scheme..]
        .find(['/', '?', '#'])
        .map_or(url.len(), |at| after_scheme + at);
    // Credentials may stand in the authority, and a password may hold a '/': with any '@' in
    // the URL, show only the scheme, which says little and leaks none.
    match url.contains('@') {
        true => &url[..after_scheme],
        false => &url[..end],
    }
}

/// Checks a notifier's or a ping's URL: `http://` or `https://` with a host, at most 2,048
/// bytes, no whitespace or control characters.
pub fn check_url(url: &str) -> Result<(), String> {
    if url.len() > 2048 {
        return Err(format!("the URL is {} bytes long; at most 2048", url.len()));
    }
    if url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("the URL holds whitespace or a control character".into());
    }
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))
        .ok_or("the URL must start with http:// or https://")?;
    let host = rest.split(['/', '?', '#']).next().unwrap_or_default();
    if host.rsplit('@').next().unwrap_or_default().is_empty() {
        return Err("the URL names no host".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_checked_and_logged_without_their_secrets() {
        assert!(check_url("https://hooks.example.com/T000/B000/XXXX").is_ok());
        assert!(check_url("http://127.0.0.1:8080").is_ok());
        for bad in ["ftp://x", "https://", "http:///path", "https://a b", "example.com"] {
            assert!(check_url(bad).is_err(), "{bad}");
        }
        assert_eq!(url_origin("https://hc-ping.com/5f0e-uuid?x=1"), "https://hc-ping.com");
        assert_eq!(url_origin("https://user:token@example.com/x"), "https://");
        assert_eq!(url_origin("https://user:pa/ss@example.com/x"), "https://");
        assert_eq!(url_origin("http://127.0.0.1:9000"), "http://127.0.0.1:9000");
    }

    #[test]
    fn secret_headers_over_plain_http_to_another_host_are_warned_of() {
        let notifier = |url: &str, value: HeaderValue| Notifier {
            name: "ops".into(),
            url: url.into(),
            headers: vec![("Authorization".into(), value)],
            on: BTreeSet::new(),
        };
        let env = || HeaderValue::Env("OPS_HOOK_TOKEN".into());
        let cases = [
            (notifier("http://hooks.internal:8080/x", env()), Some("hooks.internal")),
            (
                notifier("http://user@10.0.0.7/x", HeaderValue::File("/run/t".into())),
                Some("10.0.0.7"),
            ),
            (notifier("https://hooks.internal/x", env()), None),
            (notifier("http://127.0.0.1:9000/x", env()), None),
            (notifier("http://localhost/x", env()), None),
            (notifier("http://[::1]:9000/x", env()), None),
            (
                notifier("http://hooks.internal/x", HeaderValue::Text("ops".into())),
                None,
            ),
        ];
        for (notifier, host) in cases {
            assert_eq!(notifier.secrets_in_the_clear(), host, "{}", notifier.url);
            assert_eq!(notifier.warnings().len(), usize::from(host.is_some()));
        }
    }
}
