use super::{Ask, ElectionKeys, JobRecord, Keys, Space};

#[test]
fn layout() {
    let keys = Keys::new("prod");
    assert_eq!(keys.candidate(16, 3, 0x1f), "/shardcron/prod/shards/3/n16/1f");
    assert_eq!(
        keys.parse_candidate("/shardcron/prod/shards/3/n16/1f"),
        Some((Space::Fleet, 3, 16))
    );
    assert_eq!(
        keys.parse_candidate("/shardcron/prod/shards/db+eu:2/n4/1f"),
        Some((Space::Pool("db+eu"), 2, 4))
    );
    assert_eq!(
        keys.parse_candidate("/shardcron/prod/shards/@web-1:0/n1/1f"),
        Some((Space::Own("web-1"), 0, 1))
    );
    assert_eq!(keys.job_last("backup"), "/shardcron/prod/jobs/backup/last");
    assert_eq!(keys.node("a"), "/shardcron/prod/nodes/a");
    assert_eq!(keys.parse_node("/shardcron/prod/nodes/a"), Some("a"));
    assert_eq!(keys.parse_node("/shardcron/other/nodes/a"), None);
    assert_eq!(
        keys.parse_job_record("/shardcron/prod/jobs/backup/result"),
        Some(("backup", JobRecord::Result))
    );
    assert_eq!(
        keys.parse_job_record(&keys.job_last("a/b")),
        Some(("a/b", JobRecord::Last))
    );
    assert_eq!(keys.parse_job_record("/shardcron/prod/jobs/backup/other"), None);
    let ask = keys.ask("a", 42, Ask::Going, "x/y");
    assert_eq!(ask, "/shardcron/prod/asks/a/42/going/x/y");
    assert_eq!(keys.parse_ask("a", &ask), Some((42, Ask::Going, "x/y")));
    assert_eq!(keys.parse_ask("a", "/shardcron/prod/asks/a/42/why/x"), None);
    assert_eq!(keys.parse_ask("b", &ask), None);
}

#[test]
fn every_election_of_a_config_has_a_key_that_maps_back_to_it() {
    use crate::rules::pools::{Elections, Tags};
    let run_on = [
        Tags::default(),
        Tags::parse("web").unwrap(),
        Tags::parse("db,eu").unwrap(),
    ]
    .into();
    let elections = std::sync::Arc::new(Elections::new(4, 2, &run_on, true));
    let ours = ElectionKeys {
        keys: Keys::new("prod"),
        elections: elections.clone(),
        node: "a".into(),
    };
    let theirs = ElectionKeys {
        node: "b".into(),
        ..ours.clone()
    };
    assert_eq!(ours.prefix(4).unwrap(), "/shardcron/prod/shards/db+eu:0/n2/");
    assert_eq!(ours.prefix(8).unwrap(), "/shardcron/prod/shards/@a:0/n1/");
    for number in 0..elections.total() {
        let key = ours.candidate(number, 0x1f).unwrap();
        assert_eq!(ours.number(&key), Some(number), "{key}");
        let seen_by_b = theirs.number(&key);
        assert_eq!(
            seen_by_b,
            (number != 8).then_some(number),
            "{key}: a's own election is not b's"
        );
    }
    assert_eq!(ours.prefix(9), None);
    assert_eq!(ours.number("/shardcron/prod/shards/gpu:0/n2/1f"), None);
    assert_eq!(ours.number("/shardcron/prod/shards/web:0/n3/1f"), None);
    assert_eq!(ours.family(6), (Some("web".into()), 2));
    assert_eq!(ours.family(8), (Some("@a".into()), 1));
    assert_eq!(ours.family(1), (None, 4));
}
