//! What goes on the wire to a receiver: the webhook client (timeouts, no redirects), a
//! header's value from text, a variable or a private file, and an error told without the URL
//! (which may hold a token).

use crate::rules::notify::{HeaderValue, SEND_TIMEOUT};

/// The largest header file read.
const MAX_HEADER_FILE: u64 = 64 * 1024;
/// Idle connections kept per receiver: enough for the pings and events in flight to one host
/// to reuse, without keeping a descriptor per burst.
const IDLE_PER_HOST: usize = 8;

/// The client every event and ping is sent through; `None` (logged as an error) when it cannot
/// be built: this node then sends nothing rather than send without its timeouts and redirect
/// policy.
pub(super) fn client() -> Option<reqwest::Client> {
    reqwest::Client::builder()
        .timeout(SEND_TIMEOUT)
        .connect_timeout(SEND_TIMEOUT)
        .redirect(reqwest::redirect::Policy::none())
        .pool_max_idle_per_host(IDLE_PER_HOST)
        .user_agent(concat!("shardcron/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|err| {
            tracing::error!(error = %err, "cannot build the webhook client: this node sends no notifications and no success pings");
        })
        .ok()
}

/// What went wrong, without the URL (which may hold a token) that reqwest's message names.
pub(super) fn describe(err: &reqwest::Error) -> String {
    let what = if err.is_timeout() {
        "timed out"
    } else if err.is_connect() {
        "cannot connect"
    } else if err.is_request() {
        "the request failed"
    } else {
        "the exchange failed"
    };
    let mut cause = std::error::Error::source(err);
    let mut deepest = None;
    while let Some(next) = cause {
        deepest = Some(next.to_string());
        cause = next.source();
    }
    match deepest {
        Some(deepest) if !deepest.contains("://") => format!("{what}: {deepest}"),
        _ => what.to_string(),
    }
}

/// A header's value as it is sent; the error names the header and the variable or file, never
/// what they hold.
pub(super) async fn header_value(name: &str, value: &HeaderValue) -> Result<reqwest::header::HeaderValue, String> {
    let text = match value {
        HeaderValue::Text(text) => text.clone(),
        HeaderValue::Env(variable) => std::env::var(variable)
            .map_err(|_| format!("header {name}: the environment variable {variable} is not set (or not UTF-8)"))?,
        HeaderValue::File(path) => header_file(path)
            .await
            .map_err(|why| format!("header {name}: {}: {why}", path.display()))?,
    };
    let mut value = reqwest::header::HeaderValue::from_str(&text)
        .map_err(|_| format!("header {name}: the value holds characters a header cannot carry"))?;
    value.set_sensitive(true);
    Ok(value)
}

/// A header file's text, its last newline cut: a private regular file (as `env_file` and the
/// tokens are), read off the runtime's workers. A FIFO is refused without blocking; a file
/// on a hung mount costs a blocking thread, not a worker, and the attempt ends after
/// [`SEND_TIMEOUT`].
async fn header_file(path: &std::path::Path) -> Result<String, String> {
    use crate::secrets::{read_private_file, PrivateFileError, NOT_GROUP_OR_OTHERS};
    let owned = path.to_path_buf();
    let read = tokio::task::spawn_blocking(move || read_private_file(&owned, MAX_HEADER_FILE, NOT_GROUP_OR_OTHERS));
    let bytes = match tokio::time::timeout(SEND_TIMEOUT, read).await {
        Err(_) => return Err(format!("not read within {SEND_TIMEOUT:?}")),
        Ok(Err(err)) => return Err(format!("the read failed: {err}")),
        Ok(Ok(Err(PrivateFileError::Read(err)))) => return Err(format!("cannot read it: {}", err.kind())),
        Ok(Ok(Err(PrivateFileError::TooLarge))) => {
            return Err(format!("larger than {MAX_HEADER_FILE} bytes"));
        }
        Ok(Ok(Err(refused))) => return Err(refused.to_string()),
        Ok(Ok(Ok(bytes))) => bytes,
    };
    let text = String::from_utf8(bytes).map_err(|_| "not UTF-8".to_string())?;
    Ok(text.trim_end_matches(['\n', '\r']).to_string())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_header_file_must_be_a_private_regular_file() {
        let dir = tempfile::tempdir().unwrap();
        let private = dir.path().join("private");
        std::fs::write(&private, "Bearer t0ken\n").unwrap();
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o600)).unwrap();
        let value = header_value("Authorization", &HeaderValue::File(private))
            .await
            .unwrap();
        assert_eq!(value.to_str().unwrap(), "Bearer t0ken");

        let shared = dir.path().join("shared");
        std::fs::write(&shared, "Bearer t0ken").unwrap();
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = header_value("Authorization", &HeaderValue::File(shared.clone()))
            .await
            .unwrap_err();
        assert_eq!(
            err,
            format!(
                "header Authorization: {}: mode 0644 lets its group or others at it; `chmod 600` it",
                shared.display()
            )
        );
        assert!(!err.contains("t0ken"));

        let fifo = dir.path().join("fifo");
        let made = std::process::Command::new("mkfifo")
            .args(["-m", "600"])
            .arg(&fifo)
            .status()
            .expect("mkfifo");
        assert!(made.success());
        // No writer ever opens it: a blocking open would hang here.
        let err = tokio::time::timeout(
            Duration::from_secs(5),
            header_value("X-Key", &HeaderValue::File(fifo.clone())),
        )
        .await
        .expect("a FIFO is refused at once")
        .unwrap_err();
        assert_eq!(err, format!("header X-Key: {}: not a regular file", fifo.display()));
    }
}
