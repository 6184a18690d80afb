//! Config errors outside the jobs: the file's syntax, `[cluster]`, job names and `[etcd]`.

use super::*;

/// The file's syntax, `[cluster]` and job names.
#[test]
fn cluster_errors() {
    assert_errors(vec![
        ("[cluster\nname=".to_string(), Some(1), None, None, "unclosed table"),
        (
            HEAD.replace("shards = 16", "shards = 0"),
            Some(3),
            None,
            Some("cluster.shards"),
            "between 1 and 4096",
        ),
        (
            HEAD.replace("shards = 16", "shards = 5000"),
            Some(3),
            None,
            Some("cluster.shards"),
            "between 1 and 4096",
        ),
        (
            HEAD.replace("shards = 16", "shards = \"many\""),
            Some(3),
            None,
            Some("shards"),
            "invalid type",
        ),
        (
            HEAD.replace("lease_ttl = \"10s\"", "lease_ttl = \"500ms\""),
            Some(4),
            None,
            Some("cluster.lease_ttl"),
            "at least 1s",
        ),
        (
            HEAD.replace("lease_ttl = \"10s\"", "lease_ttl = \"ten\""),
            Some(4),
            None,
            Some("cluster.lease_ttl"),
            "invalid duration",
        ),
        (
            HEAD.replace("timezone = \"UTC\"", "timezone = \"Nowhere\""),
            Some(5),
            None,
            Some("cluster.timezone"),
            "unknown time zone",
        ),
        (
            HEAD.replace("name = \"prod\"", "name = \"a/b\""),
            Some(2),
            None,
            Some("cluster.name"),
            "invalid cluster name",
        ),
        (
            format!("{HEAD}\n[jobs.\"bad name\"]\nschedule = \"* * * * *\"\ncommand = \"true\"\n"),
            Some(10),
            Some("bad name"),
            None,
            "invalid job name",
        ),
        (
            format!(
                "{HEAD}\n[jobs.{}]\nschedule = \"* * * * *\"\ncommand = \"true\"\n",
                "x".repeat(129)
            ),
            Some(10),
            None,
            None,
            "invalid job name",
        ),
        (
            "[etcd]\nendpoints = [\"http://e:2379\"]\n".to_string(),
            None,
            None,
            Some("cluster"),
            "missing [cluster]",
        ),
    ]);
}

/// `[etcd]`: endpoints, credentials and TLS.
#[test]
fn etcd_errors() {
    assert_errors(vec![
        (
            HEAD.replace("[\"http://127.0.0.1:2379\"]", "[]"),
            Some(8),
            None,
            Some("etcd.endpoints"),
            "at least one",
        ),
        (
            HEAD.replace("endpoints = [\"http://127.0.0.1:2379\"]", ""),
            Some(7),
            None,
            Some("etcd.endpoints"),
            "missing etcd endpoints",
        ),
        (
            with_etcd("username = \"cron\"\npassword_file = \"secrets/etcd\""),
            Some(10),
            None,
            Some("etcd.password_file"),
            "must be absolute",
        ),
        (
            with_etcd("username = \"cron\"\npassword_env = \"P\"\npassword_file = \"/etc/p\""),
            Some(11),
            None,
            Some("etcd.password_file"),
            "one way",
        ),
        (
            with_etcd("password_file = \"/etc/p\""),
            Some(9),
            None,
            Some("etcd.password_file"),
            "needs a username",
        ),
        (
            with_etcd("[etcd.tls]\ncert = \"/etc/shardcron/node.pem\""),
            Some(10),
            None,
            Some("etcd.tls.cert"),
            "cert needs key",
        ),
        (
            with_etcd("[etcd.tls]\nca = \"/ca.pem\"\nkey = \"/etc/shardcron/node-key.pem\""),
            Some(11),
            None,
            Some("etcd.tls.key"),
            "key needs cert",
        ),
    ]);
}

/// `[etcd]`: compaction and how long a gone node's records are kept.
#[test]
fn etcd_retention_errors() {
    assert_errors(vec![
        (
            with_etcd("compaction = \"5s\""),
            Some(9),
            None,
            Some("etcd.compaction"),
            "compaction must be \"off\" or at least 10s",
        ),
        (
            with_etcd("compaction = \"2d\""),
            Some(9),
            None,
            Some("etcd.compaction"),
            "longer than the longest allowed, 1day",
        ),
        (
            with_etcd("compaction = \"never\""),
            Some(9),
            None,
            Some("etcd.compaction"),
            "invalid duration",
        ),
        (
            with_etcd("compaction = 300"),
            Some(9),
            None,
            Some("compaction"),
            "invalid type",
        ),
        (
            with_etcd("gone_node_retention = \"5s\""),
            Some(9),
            None,
            Some("etcd.gone_node_retention"),
            "gone_node_retention must be at least 10s",
        ),
        (
            with_etcd("gone_node_retention = \"31d\""),
            Some(9),
            None,
            Some("etcd.gone_node_retention"),
            "longer than the longest allowed, 30days",
        ),
        (
            with_etcd("gone_node_retention = \"soon\""),
            Some(9),
            None,
            Some("etcd.gone_node_retention"),
            "invalid duration",
        ),
    ]);
}
