//! Keeping the node's secrets from its jobs: the environment every child starts from, and the
//! node made not dumpable.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;

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
    use super::*;

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
