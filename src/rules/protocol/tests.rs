use std::collections::BTreeSet;

use chrono::{DateTime, Utc};

use super::outcome::{resolve, ReadRecord, Resolution};
use super::write::{next_record, Owner, Want, Writer};
use crate::rules::record::{Claim, Debt};

fn at(second: i64) -> DateTime<Utc> {
    DateTime::<Utc>::from_timestamp(1_800_000_000 + second, 0).unwrap()
}

fn claim(second: i64, term: i64, node: &str, pending: &[i64]) -> Claim {
    Claim {
        shards: (!pending.is_empty()).then_some(4),
        pool: None,
        scheduled_at: at(second),
        term,
        node: node.into(),
        pending: pending.iter().map(|second| at(*second)).collect(),
        schedule: Some("s".into()),
        others: Vec::new(),
        released: false,
        going: Vec::new(),
    }
}

/// `claim` also listing the pending ticks of the leader of `term` on `node` in an election of
/// `shards` shards.
fn owing(mut claim: Claim, term: i64, node: &str, shards: u32, pending: &[i64]) -> Claim {
    claim.others.push(Debt {
        term,
        node: node.into(),
        shards: Some(shards),
        pool: None,
        pending: pending.iter().map(|second| at(*second)).collect(),
        released: false,
    });
    claim
}

fn settling(term: i64, node: &str) -> Vec<Owner> {
    vec![Owner {
        term,
        node: node.into(),
    }]
}

#[test]
fn a_re_read_record_settles_each_write() {
    let ours = claim(10, 5, "a", &[10]);
    let seen = |revision: i64, claim: Option<Claim>| ReadRecord {
        claim,
        mod_revision: revision,
    };
    let cases = [
        (
            seen(7, Some(claim(9, 3, "b", &[]))),
            Resolution::Open,
            "unchanged since read: write again",
        ),
        (seen(0, None), Resolution::Open, "still no record"),
        (seen(8, Some(ours.clone())), Resolution::Ours, "our write landed"),
        (
            seen(8, Some(claim(10, 7, "b", &[10]))),
            Resolution::Changed,
            "another leader claimed the tick",
        ),
        (
            seen(8, Some(claim(9, 7, "b", &[]))),
            Resolution::Changed,
            "another leader wrote an older tick",
        ),
        (
            seen(8, Some(claim(10, 5, "a", &[]))),
            Resolution::Earlier,
            "the same tick with other pending ticks: an earlier attempt landed late",
        ),
        (
            seen(8, Some(claim(9, 5, "a", &[]))),
            Resolution::Changed,
            "a write of ours that did not claim the tick",
        ),
    ];
    for (seen, expected, why) in cases {
        let expected_revision = if seen.claim.is_none() { 0 } else { 7 };
        assert_eq!(resolve(&seen, expected_revision, &ours), expected, "{why}");
    }
}

#[test]
fn the_next_record_lists_what_its_writer_owes_and_keeps_what_others_owe() {
    let owed = |seconds: &[i64]| seconds.iter().map(|second| at(*second)).collect::<BTreeSet<_>>();
    let want = |fresh: &[i64], adopt: &[i64], settles: Vec<Owner>| Want {
        index: 0,
        fresh: fresh.iter().map(|second| at(*second)).collect(),
        adopt: adopt.iter().map(|second| at(*second)).collect(),
        settles,
        starts_only: false,
        fills_gap: false,
    };
    let cases = [
        (
            None,
            want(&[10], &[], vec![]),
            owed(&[]),
            Some(claim(10, 5, "a", &[10])),
            "a first claim",
        ),
        (
            Some(claim(9, 5, "a", &[9])),
            want(&[10], &[], vec![]),
            owed(&[]),
            Some(claim(10, 5, "a", &[10])),
            "tick 9 started since: only 10 is owed",
        ),
        (
            Some(claim(9, 5, "a", &[9])),
            want(&[10], &[], vec![]),
            owed(&[9]),
            Some(claim(10, 5, "a", &[9, 10])),
            "a backlog: 9 is still owed",
        ),
        (
            Some(claim(9, 5, "a", &[8, 9])),
            want(&[], &[], vec![]),
            owed(&[9]),
            Some(claim(9, 5, "a", &[9])),
            "writing a start",
        ),
        (
            Some(claim(9, 3, "b", &[9])),
            want(&[10], &[], vec![]),
            owed(&[]),
            Some(owing(claim(10, 5, "a", &[10]), 3, "b", 4, &[9])),
            "another leader's tick 9 stays listed as its own",
        ),
        (
            Some(claim(9, 3, "b", &[8, 9])),
            want(&[10], &[8, 9], settling(3, "b")),
            owed(&[]),
            Some(claim(10, 5, "a", &[8, 9, 10])),
            "a takeover adopts 8 and 9",
        ),
        (
            Some(claim(9, 3, "b", &[8, 9])),
            want(&[], &[], settling(3, "b")),
            owed(&[]),
            Some(claim(9, 5, "a", &[])),
            "a takeover that records 8 and 9 lost",
        ),
        (
            Some(claim(9, 3, "b", &[])),
            want(&[5], &[], vec![]),
            owed(&[]),
            Some(claim(9, 5, "a", &[5])),
            "an older tick never moves the record back",
        ),
        (
            Some(owing(claim(10, 7, "c", &[10]), 5, "a", 4, &[8, 9])),
            want(&[11], &[], vec![]),
            owed(&[9]),
            Some(owing(claim(11, 5, "a", &[9, 11]), 7, "c", 4, &[10])),
            "our own debt is what we owe now (8 started), the writer's is kept as its own",
        ),
        (
            Some(owing(owing(claim(10, 7, "c", &[10]), 3, "b", 4, &[8]), 2, "d", 4, &[7])),
            want(&[], &[8], settling(3, "b")),
            owed(&[]),
            Some(owing(owing(claim(10, 5, "a", &[8]), 7, "c", 4, &[10]), 2, "d", 4, &[7])),
            "a takeover settles one leader's debt and keeps the others'",
        ),
        (None, want(&[], &[], vec![]), owed(&[]), None, "nothing to write"),
    ];
    for (current, want, owed, expected, why) in cases {
        let writer = Writer {
            term: 5,
            node: "a",
            shards: 4,
            pool: None,
            releasing: false,
        };
        assert_eq!(
            next_record(current.as_ref(), &want, &owed, &writer, "s"),
            expected,
            "{why}"
        );
    }
}

#[test]
fn a_released_record_says_its_pending_ticks_never_start_and_another_writer_keeps_that() {
    let releasing = Writer {
        term: 5,
        node: "a",
        shards: 4,
        pool: None,
        releasing: true,
    };
    let owed: BTreeSet<DateTime<Utc>> = [at(10)].into();
    let written = next_record(
        Some(&claim(10, 5, "a", &[10])),
        &Want::starts_only(0),
        &owed,
        &releasing,
        "s",
    )
    .unwrap();
    assert!(written.released, "a releasing writer with ticks pending marks them");
    let nothing = next_record(Some(&written), &Want::starts_only(0), &BTreeSet::new(), &releasing, "s").unwrap();
    assert!(!nothing.released, "nothing pending, nothing released");
    let other = Writer {
        term: 7,
        node: "b",
        shards: 7,
        pool: None,
        releasing: false,
    };
    let over = next_record(Some(&written), &Want::tick(0, at(11)), &BTreeSet::new(), &other, "s").unwrap();
    assert!(!over.released, "the new writer's own ticks are not released");
    assert!(
        over.others.iter().any(|debt| debt.node == "a" && debt.released),
        "a's released ticks stay released under b's write: {over:?}"
    );
}

#[test]
fn a_record_names_the_schedule_that_made_its_tick() {
    let writer = Writer {
        term: 5,
        node: "a",
        shards: 4,
        pool: None,
        releasing: false,
    };
    let old = Claim {
        schedule: Some("old".into()),
        ..claim(9, 5, "a", &[9])
    };
    let tick = Want::tick(0, at(10));
    let moved = next_record(Some(&old), &tick, &BTreeSet::new(), &writer, "new").unwrap();
    assert_eq!(moved.schedule.as_deref(), Some("new"), "a new tick of the new schedule");
    let start = Want::starts_only(0);
    let kept = next_record(Some(&old), &start, &BTreeSet::new(), &writer, "new").unwrap();
    assert_eq!(
        kept.schedule.as_deref(),
        Some("old"),
        "tick 9 is still the old schedule's"
    );
    let older = Want::tick(0, at(5));
    let kept = next_record(Some(&old), &older, &BTreeSet::new(), &writer, "new").unwrap();
    assert_eq!(
        kept.schedule.as_deref(),
        Some("old"),
        "an older tick does not move the record"
    );
}

#[test]
fn after_another_leaders_write_a_takeover_still_settles_the_debts_the_record_lists() {
    use super::outcome::{after_reread, Reread};
    let job = crate::rules::config::Job::for_tests("j", "* * * * * *");
    // c (term 407, 3 shards) settles what a (term 330, 3 shards) left; b, a leader of the other
    // shard count, wrote the record first and kept a's debt under a's name.
    let takeover = Want::catch_up(0, vec![at(59)], vec![at(58)], settling(330, "a"));
    let before = owing(claim(58, 300, "b", &[]), 330, "a", 3, &[58]);
    let intended = next_record(Some(&before), &takeover, &BTreeSet::new(), &writer(407, "c", 3), "s");
    let by_b = owing(claim(59, 500, "b", &[59]), 330, "a", 3, &[58]);
    let seen = ReadRecord {
        claim: Some(by_b.clone()),
        mod_revision: 9,
    };
    let again = Want::catch_up(0, Vec::new(), vec![at(58)], settling(330, "a"));
    assert_eq!(
        after_reread(&job, takeover.clone(), &seen, 7, intended.clone(), false),
        Reread::Changed {
            again: Some(again),
            taken: 1
        },
        "a's debt is still listed: c still settles it"
    );
    let settled_by_b = ReadRecord {
        claim: Some(claim(59, 500, "b", &[59])),
        mod_revision: 9,
    };
    assert_eq!(
        after_reread(&job, takeover.clone(), &settled_by_b, 7, intended.clone(), false),
        Reread::Changed { again: None, taken: 1 },
        "a's debt is gone: someone else settled it"
    );
    assert_eq!(
        after_reread(&job, takeover, &settled_by_b, 7, intended, true),
        Reread::Changed {
            again: Some(Want::starts_only(0)),
            taken: 1
        },
        "the starts it carried are written again"
    );
}

fn writer(term: i64, node: &str, shards: u32) -> Writer<'_> {
    Writer {
        term,
        node,
        shards,
        pool: None,
        releasing: false,
    }
}

#[test]
fn an_on_time_claim_over_a_record_moved_less_far_claims_the_ticks_between() {
    use super::outcome::{after_reread, Reread};
    let job = crate::rules::config::Job::for_tests("j", "* * * * * *");
    // This leader claims 13; the leader of the other shard count wrote 10 meanwhile.
    let seen = ReadRecord {
        claim: Some(claim(10, 500, "b", &[10])),
        mod_revision: 9,
    };
    let on_time = Want::tick(0, at(13));
    let intended = next_record(None, &on_time, &BTreeSet::new(), &writer(407, "c", 3), "s");
    let Reread::Changed {
        again: Some(again),
        taken: 0,
    } = after_reread(&job, on_time, &seen, 0, intended.clone(), false)
    else {
        panic!("the claim is to be written again");
    };
    assert_eq!(again.fresh, vec![at(11), at(12), at(13)]);
    // A catch-up claims only what its policy chose: nothing between.
    let catch_up = Want::catch_up(0, vec![at(13)], Vec::new(), Vec::new());
    let Reread::Changed { again: Some(again), .. } = after_reread(&job, catch_up, &seen, 0, intended, false) else {
        panic!("the claim is to be written again");
    };
    assert_eq!(again.fresh, vec![at(13)]);
}

#[test]
fn a_last_write_does_not_release_a_tick_adopted_from_a_leader_that_may_have_started_it() {
    let mut owed = super::Owed::default();
    owed.owe("j", [at(5)], 7);
    assert!(owed.releasable("j"));
    owed.owe("j", [at(6)], 9);
    owed.redeliver("j", at(6));
    assert!(!owed.releasable("j"), "6 may have started under the earlier leader");
    assert_eq!(
        owed.fence("j", at(5)),
        Some(9),
        "an owed tick starts with the newest write's fence"
    );
    assert_eq!(owed.begin("j", at(6)), Some(9));
    assert!(owed.take_redelivery("j", at(6)));
    owed.started("j", at(6));
    assert!(owed.releasable("j"));
}
