//! Reading a file only the node's user may read: the checks a secret file, a credential, an
//! `env_file` and a notifier's header file share.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

/// Why a file that must be private to the node's user was not read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PrivateFileError {
    #[error("{0}")]
    Read(std::io::Error),
    #[error("mode {0:04o} lets its group or others at it; `chmod 600` it")]
    Mode(u32),
    #[error("not a regular file")]
    NotAFile,
    #[error("larger than the limit")]
    TooLarge,
}

/// Mode bits a file of secrets must not have: its group's and others'.
pub(crate) const NOT_GROUP_OR_OTHERS: u32 = 0o077;
/// Mode bits a systemd credential must not have: others'.
pub(super) const NOT_OTHERS: u32 = 0o007;

/// Reads a regular file of at most `limit` bytes whose mode has none of the `forbidden` bits.
///
/// Opened without blocking (a FIFO put in its place would otherwise hang the caller) and
/// checked on the open descriptor, so the file checked is the file read.
pub(crate) fn read_private_file(path: &Path, limit: u64, forbidden: u32) -> Result<Vec<u8>, PrivateFileError> {
    let file = File::options()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(PrivateFileError::Read)?;
    let meta = file.metadata().map_err(PrivateFileError::Read)?;
    if !meta.file_type().is_file() {
        return Err(PrivateFileError::NotAFile);
    }
    let mode = meta.mode() & 0o7777;
    if mode & forbidden != 0 {
        return Err(PrivateFileError::Mode(mode));
    }
    if meta.len() > limit {
        return Err(PrivateFileError::TooLarge);
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    // The file may grow between the check and the read: never read past the limit.
    file.take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(PrivateFileError::Read)?;
    if bytes.len() as u64 > limit {
        return Err(PrivateFileError::TooLarge);
    }
    Ok(bytes)
}
