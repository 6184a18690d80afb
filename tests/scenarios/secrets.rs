//! Secrets stay with the node: a job sees none of the node's secrets, in its own environment or
//! in the node's (`/proc/$PPID/environ`), whichever way they were given, nor a variable a
//! notifier's header names (one a reload adds included); a job's own secrets
//! come from its `env_file` and never show in status, history or logs; a secret file others may
//! read, a short API token and a username without a password each refuse the start.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use super::security::enable_auth;
use crate::support::*;
use shardcron::rules::record::Outcome;

const ETCD_PASSWORD: &str = "etcd-pw-5b1e9d27c4";
const API_TOKEN: &str = "api-token-8c3f1a6e2d9b7054";
const READ_TOKEN: &str = "read-token-4e7a0c9b3f61d285";

fn write_private(path: &Path, text: &str, mode: u32) {
    std::fs::write(path, text).expect("write");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

/// Whether this test holds CAP_SYS_PTRACE (as root in a container usually does): such a process
/// reads any process's `/proc/PID/environ`, dumpable or not, so the nodes must run without it
/// for a job's attempt to mean what it does on a real machine, where the node has no capability.
fn may_trace_anything() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let effective = status
        .lines()
        .find_map(|line| line.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .unwrap_or(0);
    // CAP_SYS_PTRACE is capability 19.
    effective & (1 << 19) != 0
}

/// What a node is started under: with no capabilities at all, as the packaged unit's
/// `CapabilityBoundingSet=` has it.
fn without_capabilities() -> Vec<&'static str> {
    if may_trace_anything() {
        vec!["setpriv", "--inh-caps=-all", "--bounding-set=-all", "--"]
    } else {
        Vec::new()
    }
}

/// A one-job config in its own cluster, whose job writes what it can see to `seen`: its own
/// environment, the node's (`/proc/$PPID/environ`, the node being its parent), the node's memory
/// map, and, read by a child of its own, its own environment (children of a non-dumpable node
/// are dumpable again).
fn spying_config(world: &World, cluster: &str, etcd_lines: &str, seen: &Path) -> PathBuf {
    let command = format!(
        r#"{{ echo "node=$PPID"; env; echo "--- node environ"; tr "\0" "\n" < /proc/$PPID/environ; echo "--- node maps"; head -c 200 /proc/$PPID/maps; echo "--- own environ"; sh -c 'tr "\0" "\n" < /proc/$PPID/environ'; }} > {seen}.tmp 2>&1; mv {seen}.tmp {seen}"#,
        seen = seen.display()
    );
    let text = format!(
        "[cluster]\nname = \"{cluster}\"\nshards = 1\nlease_ttl = \"3s\"\n\n[etcd]\nendpoints = [\"{}\"]\nusername = \"cron\"\n{etcd_lines}\n\n\
         [jobs.spy]\nschedule = \"* * * * * *\"\ncommand = \'\'\'{command}\'\'\'\n",
        world.etcd.client_url()
    );
    let path = world.dir.path().join(format!("{cluster}.toml"));
    std::fs::write(&path, text).expect("write config");
    path
}

#[test]
fn no_secret_reaches_a_job_whichever_way_the_node_was_given_it() {
    let mut world = World::new();
    enable_auth(&world.etcd.client_url(), ETCD_PASSWORD);
    let dir = world.dir.path().to_path_buf();
    let wrapper = without_capabilities();

    step("secrets in variables the config and flags name");
    let seen_env = dir.join("seen-env");
    let config = spying_config(&world, "by-env", "password_env = \"ETCD_PASSWORD_OF_NODE\"", &seen_env);
    world
        .node("by-env", &config)
        .under(&wrapper)
        .args(&[
            "--api-token-env",
            "TOKEN_OF_NODE",
            "--api-read-token-env",
            "READ_TOKEN_OF_NODE",
        ])
        .env(&[
            ("ETCD_PASSWORD_OF_NODE", ETCD_PASSWORD),
            ("TOKEN_OF_NODE", API_TOKEN),
            ("READ_TOKEN_OF_NODE", READ_TOKEN),
            ("NOTIFY_SOCKET", "/nonexistent/notify"),
            ("SHARDCRON_ANYTHING", "node-setting"),
            ("LEFT_FOR_JOBS", "visible"),
        ])
        .start();

    step("secrets in files only the node's user may read");
    let seen_file = dir.join("seen-file");
    let (password_file, token_file, read_file) = (dir.join("etcd-pw"), dir.join("token"), dir.join("read-token"));
    write_private(&password_file, &format!("{ETCD_PASSWORD}\n"), 0o600);
    write_private(&token_file, &format!("{API_TOKEN}\n"), 0o600);
    write_private(&read_file, READ_TOKEN, 0o400);
    let config = spying_config(
        &world,
        "by-file",
        &format!("password_file = \"{}\"", password_file.display()),
        &seen_file,
    );
    let port = shardcron::etcd_server::free_port().expect("port");
    world
        .node("by-file", &config)
        .under(&wrapper)
        .args(&["--http-addr", &port.to_string()])
        .env(&[
            ("SHARDCRON_API_TOKEN_FILE", token_file.to_str().expect("path")),
            ("SHARDCRON_API_READ_TOKEN_FILE", read_file.to_str().expect("path")),
            ("LEFT_FOR_JOBS", "visible"),
        ])
        .start();

    step("secrets as systemd credentials");
    let seen_cred = dir.join("seen-cred");
    let credentials = dir.join("credentials");
    std::fs::create_dir(&credentials).expect("credentials dir");
    write_private(&credentials.join("etcd-password"), ETCD_PASSWORD, 0o400);
    write_private(&credentials.join("api-token"), API_TOKEN, 0o400);
    write_private(&credentials.join("api-read-token"), READ_TOKEN, 0o400);
    let config = spying_config(&world, "by-cred", "", &seen_cred);
    world
        .node("by-cred", &config)
        .under(&wrapper)
        .env(&[
            ("CREDENTIALS_DIRECTORY", credentials.to_str().expect("path")),
            ("LEFT_FOR_JOBS", "visible"),
        ])
        .start();

    step("by-file's API: reads need the read token (or the write token), probes need none");
    wait_for(Duration::from_secs(30), "by-file serves HTTP", || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    let read = |token: Option<&str>| {
        let bearer = token.map(|token| format!("Bearer {token}"));
        let headers: Vec<(&str, &str)> = bearer.iter().map(|value| ("Authorization", value.as_str())).collect();
        http_request(port, "GET", "/api/v1/status?jobs=false", &headers, "").status
    };
    wait_for(
        Duration::from_secs(60),
        "by-file answers a read with the read token from its file",
        || read(Some(READ_TOKEN)) == 200,
    );
    assert_eq!(read(None), 401, "a read without a token");
    assert_eq!(
        read(Some("not-the-read-token-at-all")),
        401,
        "a read with a wrong token"
    );
    assert_eq!(read(Some(API_TOKEN)), 200, "a read with the write token");
    assert_eq!(http_request(port, "GET", "/healthz", &[], "").status, 200, "a probe");

    for (node, seen) in [(0, &seen_env), (1, &seen_file), (2, &seen_cred)] {
        let id = world.nodes[node].id.clone();
        wait_for(Duration::from_secs(60), &format!("a run of {id}'s job"), || {
            seen.exists()
        });
        let text = std::fs::read_to_string(seen).expect("what the job saw");
        let log = world.nodes[node].log_text();
        step(&format!("{id}: the job saw {} lines", text.lines().count()));
        assert!(
            log.contains("API token loaded") && log.contains("API read token loaded"),
            "{id} loaded both tokens:\n{log}"
        );
        for secret in [ETCD_PASSWORD, API_TOKEN, READ_TOKEN] {
            assert!(!text.contains(secret), "{id}: the job saw a secret:\n{text}");
        }
        for name in ["NOTIFY_SOCKET=", "CREDENTIALS_DIRECTORY=", "SHARDCRON_"] {
            assert!(!text.contains(name), "{id}: the job saw {name}:\n{text}");
        }
        let (own, rest) = text.split_once("--- node environ").expect("sections");
        let (node_environ, rest) = rest.split_once("--- node maps").expect("sections");
        let (node_maps, own_environ) = rest.split_once("--- own environ").expect("sections");
        assert!(
            own.contains("LEFT_FOR_JOBS=visible") && own.contains("CRON_JOB=spy") && own.contains("PATH="),
            "{id}: the job keeps the rest of the node's environment:\n{own}"
        );
        let node_pid = world.nodes[node].child.id();
        assert!(
            own.contains(&format!("node={node_pid}")),
            "{id}: the job's parent is the node:\n{own}"
        );
        assert!(
            node_environ.contains("Permission denied") && !node_environ.contains("PATH="),
            "{id}: the job read the node's environment:\n{node_environ}"
        );
        assert!(
            !node_maps.contains("r-xp") && !node_maps.contains("r--p"),
            "{id}: the job read the node's memory map:\n{node_maps}"
        );
        assert!(
            own_environ.contains("CRON_JOB=spy"),
            "{id}: a child of the job could not read the job's environment (the job is not dumpable):\n{own_environ}"
        );
    }
}

/// A config whose one job writes its environment to `seen`, with `notifiers` (whole
/// `[notify.<name>]` tables) listed on the job.
fn env_printing_config(world: &World, seen: &Path, notifiers: &[(&str, &str)]) -> PathBuf {
    let names: Vec<String> = notifiers.iter().map(|(name, _)| format!("{name:?}")).collect();
    let mut text = format!(
        "[cluster]\nname = \"hooks\"\nshards = 1\nlease_ttl = \"3s\"\n\n[etcd]\nendpoints = [\"{}\"]\n\n\
         [jobs.spy]\nschedule = \"* * * * * *\"\ncommand = 'env > {seen}.tmp; mv {seen}.tmp {seen}'\nnotify = [{}]\n\n",
        world.etcd.client_url(),
        names.join(", "),
        seen = seen.display(),
    );
    for (name, table) in notifiers {
        text.push_str(&format!(
            "[notify.{name}]\nurl = \"http://127.0.0.1:9/hook\"\n{table}\n\n"
        ));
    }
    let path = world.dir.path().join("hooks.toml");
    std::fs::write(&path, text).expect("write config");
    path
}

#[test]
fn a_notifier_header_variable_never_reaches_a_job_even_one_a_reload_adds() {
    const HOOK_TOKEN: &str = "hook-token-3f9a1c7e5b";
    const LATER_TOKEN: &str = "later-token-8d2e6b0a4c";
    let mut world = World::new();
    let dir = world.dir.path().to_path_buf();
    let seen = |name: &str| dir.join(name);
    let ops = ("ops", "headers = { Authorization = { env = \"OPS_HOOK_TOKEN\" } }");
    let later = ("later", "headers = { X-Token = { env = \"LATER_HOOK_TOKEN\" } }");
    let config = env_printing_config(&world, &seen("at-start"), &[ops]);
    world
        .node("a", &config)
        .args(&["--api-token-env", "NODE_API_TOKEN"])
        .env(&[
            ("OPS_HOOK_TOKEN", HOOK_TOKEN),
            ("LATER_HOOK_TOKEN", LATER_TOKEN),
            ("NODE_API_TOKEN", API_TOKEN),
            ("LEFT_FOR_JOBS", "visible"),
        ])
        .start();
    let job_saw = |file: &str| {
        wait_for(Duration::from_secs(60), &format!("a run writing {file}"), || {
            seen(file).exists()
        });
        std::fs::read_to_string(seen(file)).expect("what the job saw")
    };
    let assert_hidden = |file: &str, text: &str, hidden: &[&str]| {
        assert!(
            text.contains("LEFT_FOR_JOBS=visible") && text.contains("CRON_JOB=spy"),
            "{file}: the job keeps the rest of the node's environment:\n{text}"
        );
        for secret in hidden {
            assert!(!text.contains(secret), "{file}: the job saw {secret}:\n{text}");
        }
    };

    step("at start: the header's variable is not in the job's environment");
    let text = job_saw("at-start");
    assert_hidden("at-start", &text, &["OPS_HOOK_TOKEN", HOOK_TOKEN]);
    assert!(
        text.contains(&format!("LATER_HOOK_TOKEN={LATER_TOKEN}")),
        "a variable no notifier names yet is the job's:\n{text}"
    );

    step("a reload adds a notifier whose header names another variable: runs after it lack it too");
    env_printing_config(&world, &seen("after-reload"), &[ops, later]);
    world.nodes[0].signal(libc::SIGHUP);
    let text = job_saw("after-reload");
    assert_hidden(
        "after-reload",
        &text,
        &["OPS_HOOK_TOKEN", HOOK_TOKEN, "LATER_HOOK_TOKEN", LATER_TOKEN],
    );

    step("a reload whose header names the node's API token variable is rejected, the field named");
    env_printing_config(
        &world,
        &seen("never"),
        &[("leak", "headers = { X-Token = { env = \"NODE_API_TOKEN\" } }")],
    );
    world.nodes[0].signal(libc::SIGHUP);
    wait_for(Duration::from_secs(30), "the reload rejected", || {
        world.nodes[0].log_text().lines().any(|line| {
            line.contains("reload rejected")
                && line.contains("notify.leak.headers.X-Token")
                && line.contains("NODE_API_TOKEN")
                && line.contains("--api-token-env")
        })
    });
    assert!(!seen("never").exists(), "the rejected config's job ran");
    assert!(
        !world.nodes[0].log_text().contains(API_TOKEN),
        "the log shows the token"
    );

    step("a reload that drops both notifiers: a variable once a secret stays hidden");
    env_printing_config(&world, &seen("after-drop"), &[]);
    world.nodes[0].signal(libc::SIGHUP);
    let text = job_saw("after-drop");
    assert_hidden(
        "after-drop",
        &text,
        &["OPS_HOOK_TOKEN", HOOK_TOKEN, "LATER_HOOK_TOKEN", LATER_TOKEN],
    );
}

#[test]
fn a_jobs_env_file_reaches_it_and_its_values_show_nowhere_else() {
    let mut world = World::new();
    let dir = world.dir.path().to_path_buf();
    let (private, open, got) = (dir.join("private.env"), dir.join("open.env"), dir.join("got"));
    write_private(
        &private,
        "# the job's own secrets\nJOB_SECRET=\"env-file-value-61c0\"\n\nOTHER=plain-7d2\n",
        0o600,
    );
    write_private(&open, "JOB_SECRET=open-value-93a4\n", 0o644);
    let config = world.write_config_tables(
        "jobs.toml",
        1,
        3,
        &[
            (
                "private",
                format!(
                    "schedule = \"* * * * * *\"\ncommand = 'printf \"%s %s\" \"$JOB_SECRET\" \"$OTHER\" > {}'\nenv_file = \"{}\"",
                    got.display(),
                    private.display()
                ),
            ),
            (
                "open",
                format!(
                    "schedule = \"* * * * * *\"\ncommand = 'true'\nenv_file = \"{}\"",
                    open.display()
                ),
            ),
        ],
    );
    world.node("a", &config).start();

    step("the private file's values reach the job");
    wait_for(Duration::from_secs(30), "a run with the env_file's values", || {
        std::fs::read_to_string(&got).is_ok_and(|text| text == "env-file-value-61c0 plain-7d2")
    });

    step("a file others may read: the run is recorded spawn_failed, the reason logged");
    wait_for(Duration::from_secs(30), "open's run recorded spawn_failed", || {
        last_run(&world.status(&config), "open").is_some_and(|run| run.outcome == Outcome::SpawnFailed)
    });
    let log = world.nodes[0].log_text();
    assert!(
        log.contains("env_file is refused") && log.contains(&format!("{}: mode 0644", open.display())),
        "the log names the file and why:\n{log}"
    );

    step("no value in status, history or the log");
    let shardcron = |args: &[&str]| -> String {
        let out = Command::new(SHARDCRON)
            .args(args)
            .arg("--config")
            .arg(&config)
            .output()
            .expect("shardcron");
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let shown = [
        shardcron(&["status", "--json"]),
        shardcron(&["status"]),
        shardcron(&["history", "private", "--json"]),
        shardcron(&["history", "open", "--json"]),
        world.nodes[0].log_text(),
    ];
    for text in shown {
        for value in ["env-file-value-61c0", "plain-7d2", "open-value-93a4"] {
            assert!(!text.contains(value), "{value} shown:\n{text}");
        }
    }
    assert!(shardcron(&["history", "open", "--json"]).contains("spawn_failed"));
}

fn start_refused(config: &Path, args: &[&str], env: &[(&str, &str)]) -> String {
    let out: Output = Command::new(SHARDCRON)
        .args(["run", "--node-id", "refused", "--config"])
        .arg(config)
        .args(args)
        .envs(env.iter().copied())
        .env_remove("CREDENTIALS_DIRECTORY")
        .output()
        .expect("run shardcron");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{args:?} {env:?}: {stderr}");
    stderr
}

#[test]
fn open_secret_files_short_tokens_and_a_username_without_a_password_refuse_the_start() {
    let dir = tempfile::tempdir().expect("dir");
    let path = |name: &str| dir.path().join(name);
    // Nothing listens there: every refusal comes before the node reaches for etcd.
    let config_with = |name: &str, etcd_lines: &str| {
        let text = format!(
            "[cluster]\nname = \"c\"\nshards = 1\n\n[etcd]\nendpoints = [\"http://127.0.0.1:9\"]\n{etcd_lines}\n\n[jobs.j]\nschedule = \"@daily\"\ncommand = \"true\"\n"
        );
        std::fs::write(path(name), text).expect("config");
        path(name)
    };
    let plain = config_with("plain.toml", "");
    write_private(&path("group-readable"), "a-password-of-some-length", 0o640);
    write_private(&path("world-readable"), API_TOKEN, 0o644);
    write_private(&path("short"), "short", 0o600);
    let credentials = path("credentials");
    std::fs::create_dir(&credentials).expect("dir");
    write_private(&credentials.join("api-token"), API_TOKEN, 0o644);
    let shown = |p: &str| path(p).display().to_string();

    step("etcd.password_file readable by its group");
    let config = config_with(
        "group.toml",
        &format!("username = \"cron\"\npassword_file = \"{}\"", shown("group-readable")),
    );
    let err = start_refused(&config, &[], &[]);
    assert!(
        err.contains(&shown("group-readable")) && err.contains("mode 0640"),
        "{err}"
    );

    step("--api-token-file readable by others");
    let err = start_refused(&plain, &["--api-token-file", &shown("world-readable")], &[]);
    assert!(
        err.contains(&shown("world-readable")) && err.contains("mode 0644"),
        "{err}"
    );

    step("a credential readable by others");
    let creds = credentials.to_str().expect("path");
    let out = Command::new(SHARDCRON)
        .args(["run", "--node-id", "refused", "--config"])
        .arg(&plain)
        .env("CREDENTIALS_DIRECTORY", creds)
        .output()
        .expect("run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("credentials/api-token") && err.contains("mode 0644"),
        "{err}"
    );

    step("API tokens shorter than 16 bytes");
    let err = start_refused(&plain, &["--api-token-env", "T"], &[("T", "fifteen-bytes!!")]);
    assert!(err.contains("15 bytes") && err.contains("at least 16"), "{err}");
    let err = start_refused(&plain, &["--api-read-token-file", &shown("short")], &[]);
    assert!(err.contains("read token") && err.contains("at least 16"), "{err}");

    step("a notifier header naming the node's token variable, token file or credentials");
    let hooked = |name: &str, source: &str| {
        let text = format!(
            "[cluster]\nname = \"c\"\nshards = 1\n\n[etcd]\nendpoints = [\"http://127.0.0.1:9\"]\n\n\
             [notify.ops]\nurl = \"https://hooks.example.com/x\"\nheaders = {{ X-Token = {source} }}\n\n\
             [jobs.j]\nschedule = \"@daily\"\ncommand = \"true\"\nnotify = [\"ops\"]\n"
        );
        std::fs::write(path(name), text).expect("config");
        path(name)
    };
    write_private(&path("token"), API_TOKEN, 0o600);
    let config = hooked("by-env.toml", "{ env = \"NODE_TOKEN\" }");
    let err = start_refused(
        &config,
        &["--api-token-env", "NODE_TOKEN"],
        &[("NODE_TOKEN", API_TOKEN)],
    );
    assert!(
        err.contains("notify.ops.headers.X-Token") && err.contains("NODE_TOKEN") && err.contains("--api-token-env"),
        "{err}"
    );
    let config = hooked("by-file.toml", &format!("{{ file = \"{}\" }}", shown("token")));
    let err = start_refused(&config, &["--api-token-file", &shown("token")], &[]);
    assert!(
        err.contains("notify.ops.headers.X-Token") && err.contains("--api-token-file"),
        "{err}"
    );
    let config = hooked(
        "by-cred.toml",
        &format!("{{ file = \"{}\" }}", credentials.join("etcd-password").display()),
    );
    let out = Command::new(SHARDCRON)
        .args(["run", "--node-id", "refused", "--config"])
        .arg(&config)
        .env("CREDENTIALS_DIRECTORY", creds)
        .env_remove("SHARDCRON_API_TOKEN_FILE")
        .output()
        .expect("run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("$CREDENTIALS_DIRECTORY"), "{err}");
    step("check names the line and field of a header naming what the file says is secret");
    let config = hooked("by-shardcron.toml", "{ env = \"SHARDCRON_API_TOKEN_ENV\" }");
    let out = Command::new(SHARDCRON)
        .args(["check", "--config"])
        .arg(&config)
        .output()
        .expect("check");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("by-shardcron.toml:10:")
            && err.contains("field \"notify.ops.headers.X-Token\"")
            && err.contains("SHARDCRON_*"),
        "{err}"
    );

    step("a username without a password source");
    let config = config_with("nopass.toml", "username = \"cron\"");
    let err = start_refused(&config, &[], &[]);
    assert!(
        err.contains(&config.display().to_string()) && err.contains("etcd.username") && err.contains("etcd-password"),
        "{err}"
    );

    step("a client certificate without its key: check names the line and field");
    let config = config_with("tls.toml", "[etcd.tls]\ncert = \"/etc/shardcron/node.pem\"");
    let out = Command::new(SHARDCRON)
        .args(["check", "--config"])
        .arg(&config)
        .output()
        .expect("check");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("tls.toml:8:") && err.contains("field \"etcd.tls.cert\"") && err.contains("needs key"),
        "{err}"
    );
}
