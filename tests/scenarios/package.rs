//! The Debian package, built by `scripts/deb` from the tested binary with the real `dpkg-deb`:
//! its contents, its control data, and that the packaged binary runs from an unpacked tree. Not
//! installed on the machine.

use std::path::Path;
use std::process::Command;

use crate::support::SHARDCRON;

fn run(program: &str, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|err| panic!("cannot run {program} ({err}); scripts/setup installs dpkg"));
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn the_deb_holds_the_binary_unit_conffile_man_page_and_completions() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("out");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/deb");
    let package = run(
        script.to_str().expect("path"),
        &["--binary", SHARDCRON, "--out", out.to_str().expect("path"), "--fast"],
    );
    let package = package.trim();
    assert!(
        package.ends_with(&format!(
            "shardcron_{}_{}.deb",
            env!("CARGO_PKG_VERSION"),
            run("dpkg", &["--print-architecture"]).trim()
        )),
        "{package}"
    );

    let listing = run("dpkg-deb", &["--contents", package]);
    for path in [
        "./usr/bin/shardcron",
        "./lib/systemd/system/shardcron.service",
        "./etc/shardcron/jobs.toml",
        "./usr/share/man/man1/shardcron.1.gz",
        "./usr/share/bash-completion/completions/shardcron",
        "./usr/share/zsh/vendor-completions/_shardcron",
        "./usr/share/fish/vendor_completions.d/shardcron.fish",
    ] {
        assert!(
            listing.lines().any(|line| line.ends_with(path)),
            "{path} missing:\n{listing}"
        );
    }
    assert!(
        listing.lines().all(|line| line.contains(" root/root ")),
        "files belong to root:\n{listing}"
    );
    // Its ping URLs and header values may be secrets: no other user reads it, and the node's
    // group only once the package made that group (postinst, below).
    let config_line = listing
        .lines()
        .find(|line| line.ends_with("./etc/shardcron/jobs.toml"))
        .expect("jobs.toml listed");
    assert!(config_line.starts_with("-rw-r----- "), "{config_line}");
    assert_eq!(run("dpkg-deb", &["--field", package, "Package"]).trim(), "shardcron");
    assert_eq!(
        run("dpkg-deb", &["--field", package, "Version"]).trim(),
        env!("CARGO_PKG_VERSION")
    );

    let control = dir.path().join("control");
    run("dpkg-deb", &["--control", package, control.to_str().expect("path")]);
    let conffiles = std::fs::read_to_string(control.join("conffiles")).expect("conffiles");
    assert_eq!(conffiles.trim(), "/etc/shardcron/jobs.toml");
    let postinst = std::fs::read_to_string(control.join("postinst")).expect("postinst");
    assert!(
        postinst.contains("adduser --system"),
        "the package creates the shardcron system user"
    );
    let made_user = postinst.find("adduser --system").expect("adduser");
    let group_set = postinst
        .find("dpkg-statoverride --update --add root shardcron 0640 /etc/shardcron/jobs.toml")
        .unwrap_or_else(|| panic!("postinst gives jobs.toml to root:shardcron 0640:\n{postinst}"));
    assert!(
        made_user < group_set,
        "the group exists before jobs.toml is given to it:\n{postinst}"
    );
    let postrm = std::fs::read_to_string(control.join("postrm")).expect("postrm");
    assert!(
        postrm.contains("dpkg-statoverride --remove /etc/shardcron/jobs.toml"),
        "a purge removes the override:\n{postrm}"
    );
    for script in ["postinst", "postrm"] {
        run("sh", &["-n", control.join(script).to_str().expect("path")]);
    }

    let tree = dir.path().join("tree");
    run("dpkg-deb", &["--extract", package, tree.to_str().expect("path")]);
    let unit = std::fs::read_to_string(tree.join("lib/systemd/system/shardcron.service")).expect("unit");
    assert!(unit.contains("ExecStart=/usr/bin/shardcron run"), "{unit}");
    assert!(
        unit.contains("User=shardcron") && unit.contains("Type=notify"),
        "{unit}"
    );
    let binary = tree.join("usr/bin/shardcron");
    unit_is_hardened_and_verifies(&unit, dir.path(), &binary);
    let version = run(binary.to_str().expect("path"), &["--version"]);
    assert!(
        version.starts_with(&format!("shardcron {} (", env!("CARGO_PKG_VERSION"))),
        "{version}"
    );
    let config = tree.join("etc/shardcron/jobs.toml");
    run(
        binary.to_str().expect("path"),
        &["check", "--config", config.to_str().expect("path")],
    );
}

/// The unit's hardening and credentials are there, and `systemd-analyze verify` finds nothing
/// to say about it. The package is not installed, so the unit is verified as a copy whose
/// ExecStart names the unpacked binary (verify checks that the program exists and is
/// executable); nothing else in it changes.
fn unit_is_hardened_and_verifies(unit: &str, dir: &Path, binary: &Path) {
    for line in [
        "NoNewPrivileges=true",
        "LimitNOFILE=65536",
        "TasksMax=4096",
        "OOMPolicy=continue",
        "ProtectSystem=full",
        "ProtectHome=tmpfs",
        "PrivateTmp=yes",
        "PrivateDevices=yes",
        "ProtectProc=invisible",
        "ProtectHostname=yes",
        "SystemCallFilter=@system-service",
        "SystemCallErrorNumber=EPERM",
        "RestrictNamespaces=yes",
        "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK",
        "RemoveIPC=yes",
        "ProtectKernelTunables=yes",
        "ProtectKernelModules=yes",
        "ProtectKernelLogs=yes",
        "ProtectControlGroups=yes",
        "ProtectClock=yes",
        "RestrictSUIDSGID=yes",
        "RestrictRealtime=yes",
        "LockPersonality=yes",
        "SystemCallArchitectures=native",
        "CapabilityBoundingSet=",
        "UMask=0027",
        "LoadCredential=etcd-password",
        "LoadCredential=api-token",
        "LoadCredential=api-read-token",
    ] {
        assert!(unit.lines().any(|have| have == line), "the unit lacks {line}:\n{unit}");
    }
    // Every run's lease gate reads /proc/uptime, which ProcSubset=pid hides: it would refuse
    // every run.
    assert!(
        !unit.lines().any(|line| line.starts_with("ProcSubset=")),
        "the unit hides /proc/uptime:\n{unit}"
    );
    assert!(
        !unit.lines().any(|line| line.starts_with("EnvironmentFile=")),
        "secrets come as credentials, not from an environment file:\n{unit}"
    );
    let copy = dir.join("verify").join("shardcron.service");
    std::fs::create_dir_all(copy.parent().expect("dir")).expect("dir");
    let exec = binary.to_str().expect("path");
    let text = unit.replace("ExecStart=/usr/bin/shardcron ", &format!("ExecStart={exec} "));
    assert_ne!(text, unit, "the unit's ExecStart is /usr/bin/shardcron");
    std::fs::write(&copy, text).expect("write the unit's copy");
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&copy)
        .output()
        .unwrap_or_else(|err| panic!("cannot run systemd-analyze ({err}); scripts/setup installs systemd"));
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // It exits 0 on an unknown key too, with a warning: any output is a finding.
    assert!(
        out.status.success() && said.trim().is_empty(),
        "systemd-analyze verify: {said}"
    );
}

/// `rust-version` says what the dependency graph needs: the highest `rust-version` of any
/// package this platform builds from Cargo.lock. A dependency bump that needs a newer Rust fails
/// here until it is raised. Offline and filtered to the build's own platform: a fresh machine's
/// cache holds only the crates its build downloaded, never the Windows- or Android-only ones.
#[test]
fn rust_version_is_what_the_dependency_graph_needs() {
    let metadata = Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--locked",
            "--offline",
            "--format-version",
            "1",
            "--filter-platform",
        ])
        .arg(env!("SHARDCRON_BUILD_TARGET"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo metadata");
    assert!(
        metadata.status.success(),
        "{}",
        String::from_utf8_lossy(&metadata.stderr)
    );
    let metadata: serde_json::Value = serde_json::from_slice(&metadata.stdout).expect("metadata JSON");
    let parse = |version: &str| -> Vec<u64> { version.split('.').map(|part| part.parse().unwrap_or(0)).collect() };
    let resolved: Vec<&str> = metadata["resolve"]["nodes"]
        .as_array()
        .expect("resolve")
        .iter()
        .filter_map(|node| node["id"].as_str())
        .collect();
    let mut needed: Option<(Vec<u64>, String)> = None;
    let mut ours = None;
    for package in metadata["packages"].as_array().expect("packages") {
        let (Some(id), Some(version)) = (package["id"].as_str(), package["rust_version"].as_str()) else {
            continue;
        };
        if package["name"] == "shardcron" {
            ours = Some(parse(version));
        } else if resolved.contains(&id) && needed.as_ref().is_none_or(|(most, _)| parse(version) > *most) {
            needed = Some((parse(version), format!("{} {}", package["name"], package["version"])));
        }
    }
    let (needed, by) = needed.expect("dependencies declare rust-version");
    let trim = |mut version: Vec<u64>| {
        while version.len() > 2 && version.last() == Some(&0) {
            version.pop();
        }
        version
    };
    assert_eq!(
        trim(ours.expect("our rust-version")),
        trim(needed),
        "Cargo.toml's rust-version must be what the graph needs ({by})"
    );
}
