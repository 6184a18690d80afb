//! `[etcd.tls]` against a real etcd serving TLS with client certificates (made here with rcgen),
//! and `username` / `password_env` against a real etcd with auth enabled; wrong certificates and
//! passwords end in a clear error.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use crate::support::*;
use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair};
use shardcron::etcd_server::{EtcdServer, ServerTls};
use shardcron::serving::status::Status;

struct Authority {
    cert: rcgen::Certificate,
    params: CertificateParams,
    key: KeyPair,
}

fn authority(name: &str) -> Authority {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    let key = KeyPair::generate().expect("CA key");
    let cert = params.self_signed(&key).expect("CA certificate");
    Authority { cert, params, key }
}

/// Writes `NAME.pem` and `NAME-key.pem` for a certificate signed by `ca`.
fn issue(dir: &Path, ca: &Authority, name: &str, usage: ExtendedKeyUsagePurpose) -> (PathBuf, PathBuf) {
    let mut params = CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()]).expect("params");
    params.distinguished_name.push(DnType::CommonName, name);
    params.extended_key_usages = vec![usage];
    let key = KeyPair::generate().expect("key");
    let issuer = rcgen::Issuer::from_params(&ca.params, &ca.key);
    let cert = params.signed_by(&key, &issuer).expect("sign");
    let (cert_path, key_path) = (dir.join(format!("{name}.pem")), dir.join(format!("{name}-key.pem")));
    std::fs::write(&cert_path, cert.pem()).expect("write certificate");
    std::fs::write(&key_path, key.serialize_pem()).expect("write key");
    (cert_path, key_path)
}

fn write_ca(dir: &Path, ca: &Authority, name: &str) -> PathBuf {
    let path = dir.join(format!("{name}.pem"));
    std::fs::write(&path, ca.cert.pem()).expect("write CA");
    path
}

fn config_with(world: &World, file: &str, etcd_extra: &str) -> PathBuf {
    let text = format!(
        "[cluster]\nname = \"secure\"\nshards = 2\nlease_ttl = \"3s\"\n\n[etcd]\nendpoints = [\"{}\"]\n{etcd_extra}\n\n\
         [jobs.tick]\nschedule = \"* * * * * *\"\ncommand = '{}'\n",
        world.etcd.client_url(),
        world.record_command()
    );
    let path = world.dir.path().join(file);
    std::fs::write(&path, text).expect("write config");
    path
}

fn shardcron(args: &[&str], config: &Path, env: &[(&str, &str)]) -> Output {
    Command::new(SHARDCRON)
        .args(args)
        .arg("--config")
        .arg(config)
        .envs(env.iter().copied())
        .env("SHARDCRON_NODE_ID", "probe")
        .output()
        .expect("run shardcron")
}

on_both_etcds! {
    fn a_node_runs_against_etcd_over_tls_with_a_client_certificate_and_a_wrong_ca_is_a_clear_error() {
        let dir = tempfile::tempdir().expect("temp dir");
        let ca = authority("shardcron test CA");
        let ca_path = write_ca(dir.path(), &ca, "ca");
        let (server_cert, server_key) = issue(dir.path(), &ca, "etcd", ExtendedKeyUsagePurpose::ServerAuth);
        let (client_cert, client_key) = issue(dir.path(), &ca, "node", ExtendedKeyUsagePurpose::ClientAuth);
        let etcd = EtcdServer::start_tls(
            &etcd_bin(),
            ServerTls {
                cert: server_cert,
                key: server_key,
                ca: ca_path.clone(),
            },
        )
        .expect("start etcd with TLS");
        let mut world = World::with_etcd(etcd, dir);
        let tls = |ca: &Path| {
            format!(
                "[etcd.tls]\nca = \"{}\"\ncert = \"{}\"\nkey = \"{}\"",
                ca.display(),
                client_cert.display(),
                client_key.display()
            )
        };
        let config = config_with(&world, "jobs.toml", &tls(&ca_path));
        assert!(world.etcd.client_url().starts_with("https://"));

        step("a node with the right CA and client certificate runs its jobs");
        world.node("a", &config).start();
        wait_for(Duration::from_secs(30), "3 runs over TLS", || world.runs().len() >= 3);
        assert_eq!(world.status(&config).shards[0].leader.as_deref(), Some("a"));

        step("another CA: status and run fail with a clear error");
        let other = authority("some other CA");
        let other_path = write_ca(world.dir.path(), &other, "other-ca");
        let wrong = config_with(&world, "wrong-ca.toml", &tls(&other_path));
        let status = shardcron(&["status"], &wrong, &[]);
        let stderr = String::from_utf8_lossy(&status.stderr);
        assert!(!status.status.success(), "status with the wrong CA failed");
        assert!(
            stderr.contains("certificate"),
            "the error names the certificate problem: {stderr}"
        );
        let run = shardcron(&["run"], &wrong, &[]);
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert_eq!(run.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains("certificate"), "{stderr}");

        step("no client certificate: etcd refuses the connection");
        let no_cert = config_with(
            &world,
            "no-cert.toml",
            &format!("[etcd.tls]\nca = \"{}\"", ca_path.display()),
        );
        let status = shardcron(&["status"], &no_cert, &[]);
        assert!(!status.status.success(), "{}", String::from_utf8_lossy(&status.stdout));
    }
}

/// Turns on etcd auth with a root user and a `cron` user that may only touch `/shardcron/`.
pub(crate) fn enable_auth(endpoint: &str, password: &str) {
    use etcd_client::{Client, Permission};
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let mut client = Client::connect([endpoint], None).await.expect("connect");
        client.role_add("root").await.expect("root role");
        client.user_add("root", "root-password", None).await.expect("root user");
        client.user_grant_role("root", "root").await.expect("grant root");
        client.role_add("cron-rw").await.expect("cron role");
        client
            .role_grant_permission("cron-rw", Permission::read_write("/shardcron/").with_prefix())
            .await
            .expect("grant the prefix");
        client.user_add("cron", password, None).await.expect("cron user");
        client.user_grant_role("cron", "cron-rw").await.expect("grant cron");
        client.auth_enable().await.expect("enable auth");
    });
}

on_both_etcds! {
    fn a_node_authenticates_with_password_env_and_a_wrong_password_is_a_clear_error() {
        let mut world = World::new();
        enable_auth(&world.etcd.client_url(), "s3cret");
        let auth = "username = \"cron\"\npassword_env = \"SHARDCRON_TEST_ETCD_PASSWORD\"";
        let config = config_with(&world, "jobs.toml", auth);

        step("the right password from the named variable");
        let node = world
            .node("a", &config)
            .env(&[("SHARDCRON_TEST_ETCD_PASSWORD", "s3cret")])
            .start();
        wait_for(Duration::from_secs(30), "3 runs with auth", || world.runs().len() >= 3);
        let status = shardcron(
            &["status", "--json"],
            &config,
            &[("SHARDCRON_TEST_ETCD_PASSWORD", "s3cret")],
        );
        assert!(status.status.success(), "{}", String::from_utf8_lossy(&status.stderr));
        let status: Status = serde_json::from_slice(&status.stdout).expect("JSON");
        assert!(
            status.shards.iter().any(|shard| shard.leader.as_deref() == Some("a")),
            "{status:?}"
        );
        assert!(world.nodes[node].child.try_wait().expect("wait").is_none());

        step("a wrong password: run exits 1 naming the problem");
        let run = shardcron(&["run"], &config, &[("SHARDCRON_TEST_ETCD_PASSWORD", "wrong")]);
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert_eq!(run.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains("authentication failed"), "{stderr}");

        step("the variable unset: a setup error naming it");
        let run = shardcron(&["run"], &config, &[]);
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert_eq!(run.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains("SHARDCRON_TEST_ETCD_PASSWORD"), "{stderr}");
    }
}

on_both_etcds! {
    fn an_expired_auth_token_is_refreshed_and_claims_go_on() {
        let etcd = EtcdServer::start_with_flags(&etcd_bin(), &["--auth-token-ttl=2"]).expect("etcd");
        let mut world = World::with_etcd(etcd, tempfile::tempdir().expect("temp dir"));
        enable_auth(&world.etcd.client_url(), "s3cret");
        let auth = "username = \"cron\"\npassword_env = \"SHARDCRON_TEST_ETCD_PASSWORD\"";
        let config = world.write_config_tables(
            "jobs.toml",
            1,
            3,
            &[(
                "sparse",
                format!("schedule = \"*/10 * * * * *\"\ncommand = '{}'", world.record_command()),
            )],
        );
        let config_text = std::fs::read_to_string(&config).expect("config");
        std::fs::write(&config, config_text.replace("[etcd]\n", &format!("[etcd]\n{auth}\n"))).expect("config");
        step("a job every 10 s, with etcd's auth tokens expiring after 2 s idle");
        world
            .node("a", &config)
            .env(&[("SHARDCRON_TEST_ETCD_PASSWORD", "s3cret")])
            .start();
        wait_for(Duration::from_secs(45), "3 runs, each after the token expired", || {
            world.runs().len() >= 3
        });
    }
}
