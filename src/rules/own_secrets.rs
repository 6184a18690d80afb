//! The node's own secrets, as a notifier header may not name them.
//!
//! A header `{ env = "NAME" }` or `{ file = "/path" }` is read by the node and sent to the
//! notifier's URL, which the config's author picks: naming the etcd password's variable, an API
//! token's file or a systemd credential there would ship the node's secret to anyone, with no
//! command run. So such a source is refused: config validation (and so `shardcron check`)
//! refuses what the file itself says (`[etcd]`'s sources, `SHARDCRON_*`,
//! `CREDENTIALS_DIRECTORY`, `/run/credentials/`), the node adds what only it knows (its token
//! flags and its `$CREDENTIALS_DIRECTORY`) at start and at each reload.
//!
//! Paths are compared after a lexical clean-up (`.`, `..`, repeated `/`), never by reading the
//! file system: the node, which may, adds the resolved paths itself.
//!
//! Pure.

use std::path::{Component, Path, PathBuf};

/// Where systemd puts every service's credentials: `/run/credentials/<unit>/`.
pub const SYSTEMD_CREDENTIALS: &str = "/run/credentials";

/// The variables, files and directories that hold the node's secrets, each with what it is
/// (for the error).
#[derive(Debug, Clone)]
pub struct OwnSecrets {
    vars: Vec<(String, String)>,
    files: Vec<(PathBuf, String)>,
    dirs: Vec<(PathBuf, String)>,
}

impl Default for OwnSecrets {
    /// What every node keeps to itself: `SHARDCRON_*` and `CREDENTIALS_DIRECTORY` (asked in
    /// [`OwnSecrets::refuse_env`]) and systemd's credentials.
    fn default() -> OwnSecrets {
        OwnSecrets {
            vars: Vec::new(),
            files: Vec::new(),
            dirs: vec![(PathBuf::from(SYSTEMD_CREDENTIALS), "systemd's credentials".into())],
        }
    }
}

impl OwnSecrets {
    /// Adds a variable holding a secret (`what`: "[etcd] password_env").
    pub fn var(&mut self, name: &str, what: &str) -> &mut Self {
        self.vars.push((name.to_string(), what.to_string()));
        self
    }

    /// Adds a file holding a secret.
    pub fn file(&mut self, path: &Path, what: &str) -> &mut Self {
        self.files.push((clean(path), what.to_string()));
        self
    }

    /// Adds a directory whose every file is a secret.
    pub fn dir(&mut self, path: &Path, what: &str) -> &mut Self {
        self.dirs.push((clean(path), what.to_string()));
        self
    }

    /// Why a header may not take its value from the variable `name`, if it may not.
    pub fn refuse_env(&self, name: &str) -> Option<String> {
        let why = if name.starts_with("SHARDCRON_") {
            "SHARDCRON_* variables are the node's own settings".to_string()
        } else if name == "CREDENTIALS_DIRECTORY" {
            "it locates the node's systemd credentials".to_string()
        } else {
            let (_, what) = self.vars.iter().find(|(var, _)| var == name)?;
            format!("it holds the node's own secret ({what})")
        };
        Some(format!(
            "a header may not come from the variable {name}: {why}, which the notifier would send to its URL"
        ))
    }

    /// Why a header may not take its value from the file `path`, if it may not.
    pub fn refuse_file(&self, path: &Path) -> Option<String> {
        let path = clean(path);
        let why = if let Some((_, what)) = self.files.iter().find(|(file, _)| *file == path) {
            format!("it holds the node's own secret ({what})")
        } else {
            let (dir, what) = self.dirs.iter().find(|(dir, _)| path.starts_with(dir))?;
            format!("it is under {} ({what})", dir.display())
        };
        Some(format!(
            "a header may not come from the file {}: {why}, which the notifier would send to its URL",
            path.display()
        ))
    }
}

/// `path` with `.` dropped, `..` taken back and repeated separators merged, as the kernel would
/// read it if no component were a symbolic link.
fn clean(path: &Path) -> PathBuf {
    let mut cleaned = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                // `/..` is `/`: popping the root leaves it.
                if cleaned.parent().is_some() {
                    cleaned.pop();
                }
            }
            other => cleaned.push(other),
        }
    }
    cleaned
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node() -> OwnSecrets {
        let mut secrets = OwnSecrets::default();
        secrets
            .var("ETCD_PW", "[etcd] password_env")
            .var("API_TOKEN", "--api-token-env")
            .file(Path::new("/etc/shardcron/etcd-password"), "[etcd] password_file")
            .file(Path::new("/etc/shardcron/./tokens//api"), "--api-token-file")
            .dir(Path::new("/var/run/creds/shardcron.service/"), "$CREDENTIALS_DIRECTORY");
        secrets
    }

    #[test]
    fn variables_holding_the_nodes_secrets_are_refused_and_others_taken() {
        let secrets = node();
        let cases = [
            ("ETCD_PW", Some("([etcd] password_env)")),
            ("API_TOKEN", Some("(--api-token-env)")),
            ("SHARDCRON_API_TOKEN_ENV", Some("SHARDCRON_* variables")),
            ("SHARDCRON_", Some("SHARDCRON_* variables")),
            ("CREDENTIALS_DIRECTORY", Some("systemd credentials")),
            ("OPS_HOOK_TOKEN", None),
            ("etcd_pw", None),
            ("ETCD_PW2", None),
            ("SHARDCRONX", None),
        ];
        for (name, expected) in cases {
            let got = secrets.refuse_env(name);
            match expected {
                None => assert_eq!(got, None, "{name}"),
                Some(why) => {
                    let got = got.unwrap_or_else(|| panic!("{name} taken"));
                    assert!(got.contains(why) && got.contains(name), "{name}: {got}");
                }
            }
        }
        assert_eq!(OwnSecrets::default().refuse_env("ETCD_PW"), None, "only named ones");
    }

    #[test]
    fn files_holding_the_nodes_secrets_are_refused_however_the_path_is_spelled() {
        let secrets = node();
        let cases = [
            ("/etc/shardcron/etcd-password", Some("([etcd] password_file)")),
            ("/etc/shardcron//etcd-password", Some("([etcd] password_file)")),
            ("/etc/shardcron/x/../etcd-password", Some("([etcd] password_file)")),
            ("/etc/./shardcron/tokens/api", Some("(--api-token-file)")),
            (
                "/run/credentials/shardcron.service/api-token",
                Some("under /run/credentials"),
            ),
            ("/run/credentials/other.service/x", Some("under /run/credentials")),
            ("/etc/../run/credentials/s/x", Some("under /run/credentials")),
            ("/../run/credentials/s/x", Some("under /run/credentials")),
            (
                "/var/run/creds/shardcron.service/etcd-password",
                Some("($CREDENTIALS_DIRECTORY)"),
            ),
            ("/etc/shardcron/etcd-password.bak", None),
            ("/etc/shardcron/secrets/ops-hook", None),
            ("/run/credentialsx/y", None),
            ("/run/credentials/../hook", None),
            ("/var/run/creds/other.service/x", None),
        ];
        for (path, expected) in cases {
            let got = secrets.refuse_file(Path::new(path));
            match expected {
                None => assert_eq!(got, None, "{path}"),
                Some(why) => {
                    let got = got.unwrap_or_else(|| panic!("{path} taken"));
                    assert!(got.contains(why), "{path}: {got}");
                }
            }
        }
    }
}
