//! The node's secrets (the etcd password, the API tokens) and keeping them from its jobs.
//!
//! A secret comes from one of three places, read once at start: an environment variable the
//! operator names, a file, or a systemd credential (`LoadCredential=NAME:PATH`, which systemd
//! puts in `$CREDENTIALS_DIRECTORY/NAME`), the last used only when neither of the others is
//! given. A file that its group or others may access is refused, and a credential that others
//! may (its group bits can be the mask of the ACL systemd gives the node's user): the secret
//! would be one `cat` away for other users of the machine.
//!
//! A job runs as the node's user, so two more things keep the secrets with the node:
//! [`ChildEnv`], the environment every child starts from, holds none of the variables that
//! carry a secret; and [`forbid_inspection`] makes the node not dumpable, so a job cannot read
//! the node's own environment (`/proc/<node>/environ`) or memory.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The systemd credential holding the etcd password when `[etcd]` names no other source.
pub const ETCD_PASSWORD_CREDENTIAL: &str = "etcd-password";
/// The systemd credential holding the API's write token when no flag names another source.
pub const API_TOKEN_CREDENTIAL: &str = "api-token";
/// The systemd credential holding the API's read token when no flag names another source.
pub const API_READ_TOKEN_CREDENTIAL: &str = "api-read-token";

/// A secret file larger than this is refused: no password or token is that long, and the node
/// does not read a file of any size it is pointed at.
pub const MAX_SECRET_FILE: u64 = 64 * 1024;

/// Where one secret may come from.
#[derive(Debug, Clone, Copy)]
pub struct Sources<'a> {
    /// What the secret is, for errors: "the etcd password".
    pub what: &'a str,
    /// The variable that holds it (`password_env`, `--api-token-env`).
    pub env: Option<&'a str>,
    /// The file that holds it (`password_file`, `--api-token-file`).
    pub file: Option<&'a Path>,
    /// The systemd credential read when neither `env` nor `file` is given.
    pub credential: &'a str,
}

/// Where a loaded secret came from: logged, never the secret itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    Env(String),
    File(PathBuf),
    Credential(PathBuf),
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Origin::Env(var) => write!(f, "variable {var}"),
            Origin::File(path) => write!(f, "file {}", path.display()),
            Origin::Credential(path) => write!(f, "systemd credential {}", path.display()),
        }
    }
}

/// A secret and where it came from. Its `Debug` never shows the value.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret {
    pub value: String,
    pub origin: Origin,
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Secret(from {}, {} bytes)", self.origin, self.value.len())
    }
}

/// Why a secret could not be loaded: the start ends, the operator must act. No message holds
/// a secret's value.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("{what}: the variable {var} is not set")]
    EnvUnset { what: String, var: String },
    #[error("{what}: the variable {var} is empty")]
    EnvEmpty { what: String, var: String },
    #[error("{what}: the variable {var} is not UTF-8")]
    EnvNotUtf8 { what: String, var: String },
    #[error("{what}: cannot read {}: {source}", path.display())]
    Read {
        what: String,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{what}: {} has mode {mode:04o}, which lets its group or others at it: `chmod 600 {}`", path.display(), path.display())]
    Mode { what: String, path: PathBuf, mode: u32 },
    #[error("{what}: {} is not a regular file", path.display())]
    NotAFile { what: String, path: PathBuf },
    #[error("{what}: {} is larger than {MAX_SECRET_FILE} bytes", path.display())]
    TooLarge { what: String, path: PathBuf },
    #[error("{what}: {} is empty", path.display())]
    FileEmpty { what: String, path: PathBuf },
    #[error("{what}: {} is not UTF-8", path.display())]
    FileNotUtf8 { what: String, path: PathBuf },
}

/// Loads the secret `sources` name, reading the credential from `$CREDENTIALS_DIRECTORY`;
/// `None` when no source is given and no credential of that name exists.
pub fn load(sources: Sources) -> Result<Option<Secret>, SecretError> {
    let credentials = std::env::var_os("CREDENTIALS_DIRECTORY").map(PathBuf::from);
    load_from(sources, |var| std::env::var_os(var), credentials.as_deref())
}

/// [`load`] with the environment and the credentials directory given, for tests.
fn load_from(
    sources: Sources,
    env: impl Fn(&str) -> Option<OsString>,
    credentials: Option<&Path>,
) -> Result<Option<Secret>, SecretError> {
    let what = || sources.what.to_string();
    if let Some(var) = sources.env {
        let value = env(var).ok_or_else(|| SecretError::EnvUnset {
            what: what(),
            var: var.to_string(),
        })?;
        let value = value.into_string().map_err(|_| SecretError::EnvNotUtf8 {
            what: what(),
            var: var.to_string(),
        })?;
        if value.is_empty() {
            return Err(SecretError::EnvEmpty {
                what: what(),
                var: var.to_string(),
            });
        }
        return Ok(Some(Secret {
            value,
            origin: Origin::Env(var.to_string()),
        }));
    }
    if let Some(path) = sources.file {
        let value = read_secret_file(sources.what, path, NOT_GROUP_OR_OTHERS)?;
        return Ok(Some(Secret {
            value,
            origin: Origin::File(path.to_path_buf()),
        }));
    }
    // A credential name with a '/' would reach outside the directory: ours never have one.
    let Some(dir) = credentials.filter(|_| !sources.credential.contains('/')) else {
        return Ok(None);
    };
    let path = dir.join(sources.credential);
    match std::fs::symlink_metadata(&path) {
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        _ => {}
    }
    // systemd may give the node's user a credential through an ACL, whose mask shows as the
    // group's bits: only others' bits say something about who else may read it.
    let value = read_secret_file(sources.what, &path, NOT_OTHERS)?;
    Ok(Some(Secret {
        value,
        origin: Origin::Credential(path),
    }))
}

/// A secret file's text, with the line ending an editor or `echo` leaves after it removed.
fn read_secret_file(what: &str, path: &Path, forbidden: u32) -> Result<String, SecretError> {
    let bytes = read_private_file(path, MAX_SECRET_FILE, forbidden).map_err(|err| match err {
        PrivateFileError::Read(source) => SecretError::Read {
            what: what.to_string(),
            path: path.to_path_buf(),
            source,
        },
        PrivateFileError::Mode(mode) => SecretError::Mode {
            what: what.to_string(),
            path: path.to_path_buf(),
            mode,
        },
        PrivateFileError::NotAFile => SecretError::NotAFile {
            what: what.to_string(),
            path: path.to_path_buf(),
        },
        PrivateFileError::TooLarge => SecretError::TooLarge {
            what: what.to_string(),
            path: path.to_path_buf(),
        },
    })?;
    let text = String::from_utf8(bytes).map_err(|_| SecretError::FileNotUtf8 {
        what: what.to_string(),
        path: path.to_path_buf(),
    })?;
    let value = text.strip_suffix('\n').unwrap_or(&text);
    let value = value.strip_suffix('\r').unwrap_or(value);
    if value.is_empty() {
        return Err(SecretError::FileEmpty {
            what: what.to_string(),
            path: path.to_path_buf(),
        });
    }
    Ok(value.to_string())
}

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
const NOT_OTHERS: u32 = 0o007;

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

/// The environment every child of the node starts from: the node's own, without the variables
/// that hold a secret, `NOTIFY_SOCKET` (a job must not tell systemd the node is ready or
/// stopping), `CREDENTIALS_DIRECTORY` (the node's secrets, not the job's) and every
/// `SHARDCRON_*` (the node's own settings). Built when the node starts; a reload whose config
/// names more secret variables (a notifier's header `{ env = "NAME" }`) [`scrub`]s them before
/// any run of it starts. Each run adds its job's `env_file`, `env` and `CRON_*` variables.
///
/// A variable once scrubbed stays scrubbed, even after a reload that no longer names it: its
/// value was a secret the operator gave the node, and it still is one (the node's environment
/// never changes), so nothing a config does later hands it to jobs. A job that needs the value
/// gets it from its own `env` or `env_file`.
///
/// [`scrub`]: ChildEnv::scrub
#[derive(Default)]
pub struct ChildEnv {
    /// What a run spawned now gets. Swapped whole, so a spawn reads one consistent list.
    vars: std::sync::RwLock<Arc<[(OsString, OsString)]>>,
}

impl std::fmt::Debug for ChildEnv {
    /// Names only: a value may still be something an operator would rather not see logged.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.vars().iter().map(|(name, _)| name))
            .finish()
    }
}

impl ChildEnv {
    /// `node_env` (the node's environment) without the variables named in `secret_vars` and
    /// those every node keeps to itself.
    pub fn of_node(node_env: impl IntoIterator<Item = (OsString, OsString)>, secret_vars: &[&str]) -> ChildEnv {
        let vars: Arc<[(OsString, OsString)]> = node_env
            .into_iter()
            .filter(|(name, _)| !kept_from_children(name, secret_vars))
            .collect();
        ChildEnv {
            vars: std::sync::RwLock::new(vars),
        }
    }

    /// Removes the variables named in `secret_vars` from every child spawned from now on; the
    /// names of those removed now, for the log.
    pub fn scrub<'a>(&self, secret_vars: impl IntoIterator<Item = &'a str>) -> Vec<String> {
        let secret_vars: Vec<&str> = secret_vars.into_iter().collect();
        let mut vars = self.vars.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        let removed: Vec<String> = vars
            .iter()
            .filter(|(name, _)| kept_from_children(name, &secret_vars))
            .map(|(name, _)| name.to_string_lossy().into_owned())
            .collect();
        if !removed.is_empty() {
            *vars = vars
                .iter()
                .filter(|(name, _)| !kept_from_children(name, &secret_vars))
                .cloned()
                .collect();
        }
        removed
    }

    /// The variables, in the node's order, as they are now.
    pub(crate) fn vars(&self) -> Arc<[(OsString, OsString)]> {
        // A panic while the lock was held cannot leave the list half written: it is swapped whole.
        Arc::clone(&self.vars.read().unwrap_or_else(std::sync::PoisonError::into_inner))
    }
}

fn kept_from_children(name: &OsStr, secret_vars: &[&str]) -> bool {
    let bytes = name.as_bytes();
    bytes.starts_with(b"SHARDCRON_")
        || bytes == b"NOTIFY_SOCKET"
        || bytes == b"CREDENTIALS_DIRECTORY"
        || secret_vars.iter().any(|var| var.as_bytes() == bytes)
}

/// Makes the node not dumpable: a process of the same user can then neither read
/// `/proc/<node>/environ` nor attach to or read the node's memory, where its secrets are, and
/// the node leaves no core dump holding them. Its children are dumpable again: the kernel resets
/// the flag when they exec a program they may read.
pub fn forbid_inspection() -> std::io::Result<()> {
    rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn write(dir: &Path, name: &str, text: &str, mode: u32) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).expect("write");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).expect("chmod");
        path
    }

    fn sources<'a>(env: Option<&'a str>, file: Option<&'a Path>) -> Sources<'a> {
        Sources {
            what: "the test secret",
            env,
            file,
            credential: "test-secret",
        }
    }

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> {
        let map: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |var| map.get(var).map(OsString::from)
    }

    #[test]
    fn each_source_gives_the_secret_and_says_where_it_came_from() {
        let dir = tempfile::tempdir().expect("dir");
        let file = write(dir.path(), "secret", "from-file\n", 0o600);
        let creds = tempfile::tempdir().expect("dir");
        let credential = write(creds.path(), "test-secret", "from-credential\r\n", 0o400);
        let env = env_of(&[("PASS", "from env ")]);

        let got = load_from(sources(Some("PASS"), None), &env, Some(creds.path())).expect("env");
        assert_eq!(
            got,
            Some(Secret {
                value: "from env ".into(),
                origin: Origin::Env("PASS".into())
            })
        );
        let got = load_from(sources(None, Some(&file)), &env, Some(creds.path())).expect("file");
        assert_eq!(
            got.map(|s| (s.value, s.origin)),
            Some(("from-file".into(), Origin::File(file)))
        );
        let got = load_from(sources(None, None), &env, Some(creds.path())).expect("credential");
        assert_eq!(
            got.map(|s| (s.value, s.origin)),
            Some(("from-credential".into(), Origin::Credential(credential)))
        );
        assert!(load_from(sources(None, None), &env, None).expect("none").is_none());
        let empty = tempfile::tempdir().expect("dir");
        assert!(load_from(sources(None, None), &env, Some(empty.path()))
            .expect("none")
            .is_none());
    }

    #[test]
    fn bad_sources_are_refused_with_an_error_that_names_them_and_never_the_value() {
        let dir = tempfile::tempdir().expect("dir");
        let shared = write(dir.path(), "shared", "hunter2-hunter2", 0o640);
        let others = write(dir.path(), "others", "hunter2-hunter2", 0o604);
        let empty = write(dir.path(), "empty", "\n", 0o600);
        let large = write(dir.path(), "large", &"x".repeat(MAX_SECRET_FILE as usize + 1), 0o600);
        let binary = dir.path().join("binary");
        std::fs::write(&binary, [0xff, 0xfe]).expect("write");
        std::fs::set_permissions(&binary, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        let missing = dir.path().join("missing");
        let env = env_of(&[("EMPTY", "")]);
        let cases: Vec<(Sources, &str)> = vec![
            (sources(Some("UNSET"), None), "variable UNSET is not set"),
            (sources(Some("EMPTY"), None), "variable EMPTY is empty"),
            (sources(None, Some(&shared)), "has mode 0640"),
            (sources(None, Some(&others)), "has mode 0604"),
            (sources(None, Some(&empty)), "is empty"),
            (sources(None, Some(&large)), "larger than"),
            (sources(None, Some(&binary)), "not UTF-8"),
            (sources(None, Some(&missing)), "cannot read"),
            (sources(None, Some(dir.path())), "not a regular file"),
        ];
        for (sources, expected) in cases {
            let err = load_from(sources, &env, None).expect_err(expected).to_string();
            assert!(err.contains(expected), "{err:?} lacks {expected:?}");
            assert!(err.starts_with("the test secret: "), "{err}");
            assert!(!err.contains("hunter2"), "{err}");
            if let Some(file) = sources.file {
                assert!(err.contains(&file.display().to_string()), "{err}");
            }
        }
        let creds = tempfile::tempdir().expect("dir");
        let credential = write(creds.path(), "test-secret", "x", 0o604);
        let err = load_from(sources(None, None), &env, Some(creds.path())).expect_err("mode");
        assert!(err.to_string().contains("mode 0604"), "{err}");
        // Group bits may be an ACL's mask, which systemd uses to give the node its credential.
        std::fs::set_permissions(&credential, std::fs::Permissions::from_mode(0o440)).expect("chmod");
        assert!(load_from(sources(None, None), &env, Some(creds.path())).is_ok());
    }

    #[test]
    fn a_fifo_in_place_of_a_secret_file_is_refused_without_blocking() {
        let dir = tempfile::tempdir().expect("dir");
        let fifo = dir.path().join("fifo");
        let made = std::process::Command::new("mkfifo")
            .args(["-m", "600"])
            .arg(&fifo)
            .status()
            .expect("mkfifo");
        assert!(made.success());
        let err = load_from(sources(None, Some(&fifo)), env_of(&[]), None).expect_err("a FIFO");
        assert!(err.to_string().contains("not a regular file"), "{err}");
    }

    #[test]
    fn children_get_the_node_environment_without_its_secrets_and_settings() {
        let node_env = [
            ("PATH", "/usr/bin"),
            ("HOME", "/var/lib/shardcron"),
            ("ETCD_PASS", "p"),
            ("API_TOKEN", "t"),
            ("SHARDCRON_CONFIG", "/etc/shardcron/jobs.toml"),
            ("SHARDCRON_API_TOKEN_FILE", "/x"),
            ("NOTIFY_SOCKET", "/run/systemd/notify"),
            ("CREDENTIALS_DIRECTORY", "/run/credentials/shardcron.service"),
            ("SHARDCRONX", "kept: not the prefix"),
        ]
        .map(|(name, value)| (OsString::from(name), OsString::from(value)));
        let env = ChildEnv::of_node(node_env, &["ETCD_PASS", "API_TOKEN"]);
        assert_eq!(names(&env), ["PATH", "HOME", "SHARDCRONX"]);
    }

    fn names(env: &ChildEnv) -> Vec<String> {
        env.vars()
            .iter()
            .map(|(name, _)| name.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn a_scrubbed_variable_leaves_every_later_child_and_stays_out() {
        let node_env = [("PATH", "/usr/bin"), ("HOOK", "h"), ("LATER", "l"), ("KEPT", "k")]
            .map(|(name, value)| (OsString::from(name), OsString::from(value)));
        let env = ChildEnv::of_node(node_env, &["HOOK"]);
        let before = env.vars();
        assert_eq!(names(&env), ["PATH", "LATER", "KEPT"]);
        let cases: [(&[&str], &[&str], &[&str]); 4] = [
            // (scrubbed now, removed now, left)
            (&["LATER", "UNSET"], &["LATER"], &["PATH", "KEPT"]),
            // A reload that names nothing more gives nothing back.
            (&[], &[], &["PATH", "KEPT"]),
            (&["HOOK", "LATER"], &[], &["PATH", "KEPT"]),
            (&["KEPT"], &["KEPT"], &["PATH"]),
        ];
        for (scrubbed, removed, left) in cases {
            assert_eq!(env.scrub(scrubbed.iter().copied()), removed, "{scrubbed:?}");
            assert_eq!(names(&env), left, "{scrubbed:?}");
        }
        assert_eq!(
            before.len(),
            3,
            "a list already handed out is never changed under its reader"
        );
    }
}
