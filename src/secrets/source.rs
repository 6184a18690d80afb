//! Where a secret comes from (an environment variable, a file, a systemd credential) and how
//! it is loaded, once, at start.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use super::private_file::{read_private_file, PrivateFileError, NOT_GROUP_OR_OTHERS, NOT_OTHERS};

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
}
