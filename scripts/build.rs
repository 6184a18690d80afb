//! Records the git commit a binary was built from, for `--version`, when it is built in a git
//! checkout with git installed; a build from a source tarball has none. Also records the target
//! triple, so the package test can ask `cargo metadata` for just this platform's crates.

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=.git/HEAD");
    println!("cargo:rerun-if-changed=.git/refs/heads");
    println!("cargo:rerun-if-env-changed=SHARDCRON_GIT_COMMIT");
    if let Ok(target) = std::env::var("TARGET") {
        println!("cargo:rustc-env=SHARDCRON_BUILD_TARGET={target}");
    }
    let commit = std::env::var("SHARDCRON_GIT_COMMIT").ok().or_else(|| {
        let output = Command::new("git")
            .args(["rev-parse", "--short=12", "HEAD"])
            .output()
            .ok()?;
        output
            .status
            .success()
            .then(|| String::from_utf8_lossy(&output.stdout).trim().to_string())
    });
    if let Some(commit) = commit.filter(|commit| !commit.is_empty()) {
        println!("cargo:rustc-env=SHARDCRON_GIT_COMMIT={commit}");
    }
}
