use super::*;

fn at(second: i64) -> DateTime<Utc> {
    DateTime::<Utc>::from_timestamp(1_800_000_000 + second, 0).unwrap()
}

#[test]
fn a_start_is_remembered_until_a_written_record_no_longer_lists_it() {
    let here = StartedHere::default();
    here.remember("j", at(1));
    here.remember("j", at(2));
    here.written("j", &[at(2), at(3)]);
    assert!(!here.contains("j", at(1)), "settled by the write");
    assert!(here.contains("j", at(2)), "still listed as pending");
    assert!(!here.contains("other", at(2)));
    here.written("j", &[]);
    assert!(here.lock().is_empty(), "no job kept once every start is written");
}

#[test]
fn a_job_never_written_again_keeps_only_its_newest_starts() {
    let here = StartedHere::default();
    for second in 0..(REMEMBERED_PER_JOB as i64 + 10) {
        here.remember("j", at(second));
    }
    assert!(!here.contains("j", at(9)));
    assert!(here.contains("j", at(10)));
    assert_eq!(here.lock()["j"].len(), REMEMBERED_PER_JOB);
}
