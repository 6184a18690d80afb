//! What every request and answer passes through: the `Host` check, the security headers, and
//! errors made JSON.
//!
//! A page on another site can make a browser send requests to `127.0.0.1:9464` under its own
//! host name (DNS rebinding) and read the answers; checking `Host` stops that. The headers keep
//! the dashboard out of frames and its page to its own script, style and API.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::api::Failure;
use super::listener::PeerAddr;
use super::App;

/// The dashboard loads its script and style from this listener and talks to its API; nothing
/// else, and no page may frame it.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/// The most of a non-JSON error body that is carried into its JSON form.
const ERROR_TEXT_LIMIT: usize = 4096;

pub(super) async fn guard(State(app): State<Arc<App>>, request: Request, next: Next) -> Response {
    let path = request.uri().path().to_string();
    let peer = request.extensions().get::<PeerAddr>().map(|peer| peer.0);
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|host| host.to_str().ok())
        .map(str::to_string);
    let mut response = if host_allowed(host.as_deref(), app.listen, &app.allowed_hosts) {
        next.run(request).await
    } else {
        Failure::new(
            StatusCode::MISDIRECTED_REQUEST,
            format!(
                "Host {:?} is not this listener's address or a loopback name; add it with --http-allowed-hosts",
                host.unwrap_or_default()
            ),
        )
        .into_response()
    };
    if response.status() == StatusCode::UNAUTHORIZED {
        // Held only for this peer's failures: probes need no token, other peers wait for
        // nothing.
        let hold = app.failed_tokens.failed(peer, &path);
        if !hold.is_zero() {
            tokio::time::sleep(hold).await;
        }
    }
    // Probes keep their plain-text reasons, which load balancers log as they are.
    let probe = path == "/healthz" || path == "/readyz";
    if response.status().as_u16() >= 400 && !probe && !is_json(&response) {
        response = as_json_error(response).await;
    }
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    response
}

fn is_json(response: &Response) -> bool {
    response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.starts_with("application/json"))
}

/// The same answer with its text as `{"error": "..."}`: axum's own rejections (a bad query, bad
/// JSON, a wrong method) are plain text, and API clients parse every error one way.
async fn as_json_error(response: Response) -> Response {
    let (mut parts, body) = response.into_parts();
    let text = match axum::body::to_bytes(body, ERROR_TEXT_LIMIT).await {
        Ok(bytes) => String::from_utf8_lossy(&bytes).trim().to_string(),
        Err(_) => String::new(),
    };
    let message = if text.is_empty() {
        parts.status.canonical_reason().unwrap_or("error").to_string()
    } else {
        text
    };
    let failure = Failure::new(parts.status, message).into_response();
    let (json_parts, json_body) = failure.into_parts();
    parts.headers.remove(header::CONTENT_LENGTH);
    for (name, value) in &json_parts.headers {
        parts.headers.insert(name.clone(), value.clone());
    }
    Response::from_parts(parts, Body::new(json_body))
}

/// Whether a request naming `host` is for this listener: its own address, a loopback name, or
/// one of `allowed`. Names are compared without case; a port must match where one is given.
fn host_allowed(host: Option<&str>, listen: SocketAddr, allowed: &[String]) -> bool {
    let Some(host) = host else {
        // HTTP/1.1 requires Host and every browser sends it; a request without one is no
        // browser's, but nothing legitimate lacks it either.
        return false;
    };
    let (name, port) = split_host(host);
    let name = name.to_ascii_lowercase();
    if matches!(name.as_str(), "localhost" | "127.0.0.1" | "[::1]") {
        return true;
    }
    let port_fits = |wanted: u16| port.is_none_or(|port| port == wanted);
    if let Ok(ip) = name.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>() {
        // Bound to every address, any address of the machine is the listen address; rebinding
        // needs a name, never an address.
        if (listen.ip().is_unspecified() || ip == listen.ip()) && port_fits(listen.port()) {
            return true;
        }
    }
    allowed.iter().any(|entry| {
        let (allowed_name, allowed_port) = split_host(entry.trim());
        allowed_name.eq_ignore_ascii_case(&name) && allowed_port.is_none_or(|wanted| port == Some(wanted))
    })
}

/// `name[:port]` or `[v6][:port]` into its name (brackets kept) and port.
fn split_host(host: &str) -> (&str, Option<u16>) {
    let host = host.trim();
    let split_at = if host.starts_with('[') {
        host.find(']').map(|end| end + 1)
    } else {
        host.rfind(':')
    };
    match split_at {
        Some(at) if host[at..].starts_with(':') => (&host[..at], host[at + 1..].parse().ok()),
        _ => (host, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_are_this_listener_loopback_or_allowed() {
        let local: SocketAddr = "127.0.0.1:9464".parse().unwrap();
        let public: SocketAddr = "10.0.0.5:9464".parse().unwrap();
        let any: SocketAddr = "0.0.0.0:9464".parse().unwrap();
        let allowed = vec!["cron.example.com".to_string(), "other.example:8443".to_string()];
        let cases: &[(Option<&str>, SocketAddr, bool)] = &[
            (Some("localhost"), public, true),
            (Some("LOCALHOST:9464"), public, true),
            (Some("127.0.0.1:1234"), local, true),
            (Some("[::1]"), local, true),
            (Some("[::1]:9464"), local, true),
            (Some("10.0.0.5:9464"), public, true),
            (Some("10.0.0.5"), public, true),
            (Some("10.0.0.5:80"), public, false),
            (Some("10.0.0.6:9464"), public, false),
            (Some("10.0.0.6:9464"), any, true),
            (Some("[fe80::1]:9464"), any, true),
            (Some("cron.example.com"), public, true),
            (Some("Cron.Example.COM:9464"), public, true),
            (Some("other.example:8443"), public, true),
            (Some("other.example:9464"), public, false),
            (Some("other.example"), public, false),
            (Some("attacker.example"), local, false),
            (Some("attacker.example:9464"), any, false),
            (Some("localhost.attacker.example"), local, false),
            (Some(""), local, false),
            (None, local, false),
        ];
        for (host, listen, expected) in cases {
            assert_eq!(
                host_allowed(*host, *listen, &allowed),
                *expected,
                "{host:?} on {listen}"
            );
        }
    }
}
