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
//!
//! - `source`: where a secret comes from and how it is loaded.
//! - `private_file`: reading a file only the node's user may read.
//! - `child_env`: keeping the secrets from the node's jobs.

mod child_env;
mod private_file;
mod source;

pub use child_env::{forbid_inspection, ChildEnv};
pub(crate) use private_file::{read_private_file, PrivateFileError, NOT_GROUP_OR_OTHERS};
pub use source::{
    load, Origin, Secret, SecretError, Sources, API_READ_TOKEN_CREDENTIAL, API_TOKEN_CREDENTIAL,
    ETCD_PASSWORD_CREDENTIAL, MAX_SECRET_FILE,
};
