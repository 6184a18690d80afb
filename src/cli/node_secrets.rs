//! A node's refusal of notifier headers that name its own secrets, for what only the node knows.
//!
//! Config validation (and so `shardcron check`) already refuses a header source naming what the
//! file says ([`crate::rules::own_secrets`]); the node adds its token flags (`--api-token-env`,
//! `--api-read-token-env`, `--api-token-file`, `--api-read-token-file`) and its
//! `$CREDENTIALS_DIRECTORY`, and the paths as the file system resolves them (a symbolic link to
//! a secret file is refused too), at start and at each reload.

use std::path::{Path, PathBuf};

use crate::rules::config::Config;
use crate::rules::notify::HeaderValue;

/// The node's own secret sources, kept for each reload's check.
#[derive(Debug, Clone, Default)]
pub(super) struct NodeSecrets {
    vars: Vec<(String, &'static str)>,
    files: Vec<(PathBuf, &'static str)>,
    credentials: Option<PathBuf>,
}

impl NodeSecrets {
    /// The sources `args` name, and `credentials` (the node's `$CREDENTIALS_DIRECTORY`).
    pub(super) fn of(args: &super::node_args::NodeArgs, credentials: Option<PathBuf>) -> NodeSecrets {
        let vars = [
            (&args.api_token_env, "--api-token-env"),
            (&args.api_read_token_env, "--api-read-token-env"),
        ];
        let files = [
            (&args.api_token_file, "--api-token-file"),
            (&args.api_read_token_file, "--api-read-token-file"),
        ];
        NodeSecrets {
            vars: vars
                .into_iter()
                .filter_map(|(var, what)| Some((var.clone()?, what)))
                .collect(),
            files: files
                .into_iter()
                .filter_map(|(file, what)| Some((file.clone()?, what)))
                .collect(),
            credentials,
        }
    }

    /// Refuses `config` if a notifier header of it names one of the node's secrets: the start
    /// ends, or the reload is rejected, with the file, the field and why.
    pub(super) fn check(&self, config: &Config) -> Result<(), OwnSecretRefused> {
        let mut own = config.etcd.own_secrets();
        for (var, what) in &self.vars {
            own.var(var, what);
        }
        let etcd_files = [
            (config.etcd.password_file.as_ref(), "[etcd] password_file"),
            (
                config.etcd.tls.as_ref().and_then(|tls| tls.key.as_ref()),
                "[etcd] tls.key",
            ),
        ];
        let files = self
            .files
            .iter()
            .map(|(file, what)| (file, *what))
            .chain(etcd_files.into_iter().filter_map(|(file, what)| Some((file?, what))));
        for (file, what) in files {
            own.file(file, what);
            if let Some(resolved) = resolved(file) {
                own.file(&resolved, what);
            }
        }
        if let Some(dir) = &self.credentials {
            own.dir(dir, "$CREDENTIALS_DIRECTORY, the node's credentials");
            if let Some(resolved) = resolved(dir) {
                own.dir(&resolved, "$CREDENTIALS_DIRECTORY, the node's credentials");
            }
        }
        for notifier in config.notifiers.values() {
            for (header, value) in &notifier.headers {
                let refused = match value {
                    HeaderValue::Env(var) => own.refuse_env(var),
                    HeaderValue::File(path) => own
                        .refuse_file(path)
                        .or_else(|| resolved(path).and_then(|resolved| own.refuse_file(&resolved))),
                    HeaderValue::Text(_) => None,
                };
                if let Some(why) = refused {
                    return Err(OwnSecretRefused {
                        path: config.path.clone(),
                        notifier: notifier.name.clone(),
                        header: header.clone(),
                        why,
                    });
                }
            }
        }
        Ok(())
    }
}

/// A notifier header that names one of the node's own secrets: the file, the field, and why.
#[derive(Debug, thiserror::Error)]
#[error("{}: field \"notify.{notifier}.headers.{header}\": {why}", path.display())]
pub(crate) struct OwnSecretRefused {
    path: PathBuf,
    notifier: String,
    header: String,
    why: String,
}

/// `path` with its symbolic links resolved, if it exists and differs.
fn resolved(path: &Path) -> Option<PathBuf> {
    std::fs::canonicalize(path).ok().filter(|resolved| resolved != path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(etcd: &str, header: &str) -> Config {
        let text = format!(
            "[cluster]\nname = \"c\"\nshards = 1\n\n[etcd]\nendpoints = [\"http://127.0.0.1:2379\"]\n{etcd}\n\n\
             [notify.ops]\nurl = \"https://hooks.example.com/x\"\nheaders = {{ X-Token = {header} }}\n"
        );
        crate::rules::config::parse(Path::new("/etc/shardcron/jobs.toml"), &text).expect("a valid config")
    }

    #[test]
    fn headers_naming_what_only_the_node_knows_are_refused() {
        let dir = tempfile::tempdir().expect("dir");
        let (token, credentials) = (dir.path().join("token"), dir.path().join("creds"));
        std::fs::write(&token, "t").expect("write");
        std::fs::create_dir(&credentials).expect("dir");
        let link = dir.path().join("link-to-token");
        std::os::unix::fs::symlink(&token, &link).expect("symlink");
        let node = NodeSecrets {
            vars: vec![
                ("API_TOKEN".into(), "--api-token-env"),
                ("READ_TOKEN".into(), "--api-read-token-env"),
            ],
            files: vec![(token.clone(), "--api-token-file")],
            credentials: Some(credentials.clone()),
        };
        let shown = |path: &Path| format!("{{ file = \"{}\" }}", path.display());
        let password = "username = \"u\"\npassword_file = \"/etc/shardcron/etcd-password\"";
        let cases: Vec<(&str, String, Option<&str>)> = vec![
            ("", "{ env = \"API_TOKEN\" }".into(), Some("(--api-token-env)")),
            ("", "{ env = \"READ_TOKEN\" }".into(), Some("(--api-read-token-env)")),
            ("", shown(&token), Some("(--api-token-file)")),
            ("", shown(&link), Some("(--api-token-file)")),
            (
                "",
                shown(&credentials.join("api-token")),
                Some("$CREDENTIALS_DIRECTORY"),
            ),
            (password, "{ env = \"OPS_HOOK_TOKEN\" }".into(), None),
            ("", shown(&dir.path().join("hook")), None),
            ("", "\"API_TOKEN\"".into(), None),
        ];
        for (etcd, header, refused) in cases {
            let got = node.check(&config(etcd, &header));
            match (got, refused) {
                (Ok(()), None) => {}
                (Ok(()), Some(why)) => panic!("{header} taken; expected {why:?}"),
                (Err(err), None) => panic!("{header} refused: {err}"),
                (Err(err), Some(why)) => {
                    let err = err.to_string();
                    assert!(err.contains(why), "{header}: {err}");
                    assert!(
                        err.starts_with("/etc/shardcron/jobs.toml: field \"notify.ops.headers.X-Token\": "),
                        "{err}"
                    );
                }
            }
        }
        let none = NodeSecrets::default();
        assert!(none.check(&config("", "{ env = \"API_TOKEN\" }")).is_ok());
    }
}
