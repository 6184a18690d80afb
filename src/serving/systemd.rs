//! systemd's readiness protocol (`Type=notify`): datagrams to the socket in `NOTIFY_SOCKET`.
//!
//! Written here rather than through libsystemd: the protocol is one datagram of `KEY=VALUE`
//! lines, and a node not started by systemd (no `NOTIFY_SOCKET`) sends nothing.

use std::os::unix::net::UnixDatagram;

use tokio::sync::watch;

use crate::readiness::{Readiness, Stage};

/// Sends `state` (such as `READY=1`) to systemd, if systemd is listening.
pub fn send(state: &str) {
    let Some(socket) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    if let Err(err) = send_to(&socket, state) {
        tracing::warn!(socket = ?socket, error = %err, state, "cannot notify systemd");
    }
}

fn send_to(socket: &std::ffi::OsStr, state: &str) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let datagram = UnixDatagram::unbound()?;
    let path = socket.as_bytes();
    // A leading '@' names a Linux abstract socket.
    if let Some(name) = path.strip_prefix(b"@") {
        #[cfg(target_os = "linux")]
        {
            use std::os::linux::net::SocketAddrExt;
            let address = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
            datagram.send_to_addr(state.as_bytes(), &address)?;
            return Ok(());
        }
        #[cfg(not(target_os = "linux"))]
        return Err(std::io::Error::other(format!("abstract socket {name:?} outside Linux")));
    }
    datagram.send_to(state.as_bytes(), std::path::Path::new(socket))?;
    Ok(())
}

/// Tells systemd `READY=1` each time the node becomes ready (the first time ends the start
/// job) and `STOPPING=1` when it starts to stop.
pub async fn follow(readiness: Readiness) {
    if std::env::var_os("NOTIFY_SOCKET").is_none() {
        return;
    }
    let mut stages: watch::Receiver<Stage> = readiness.watch();
    loop {
        let stage = stages.borrow_and_update().clone();
        match stage {
            Stage::Ready => send("READY=1\nSTATUS=ready: campaigning in every shard"),
            Stage::Stopping => {
                send("STOPPING=1\nSTATUS=stopping");
                return;
            }
            other => send(&format!("STATUS={}", other.reason())),
        }
        if stages.changed().await.is_err() {
            return;
        }
    }
}
