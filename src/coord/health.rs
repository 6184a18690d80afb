//! How each etcd member answers, as one node sees it, and which member its calls should go to.
//!
//! A member that stops answering without refusing (stopped, stalled on a disk, restarting and
//! not yet serving, its packets dropped) holds every call sent to it for the caller's whole
//! deadline, and a lease renewal for what is left of the lease. So a member counts as suspect
//! as soon as one probe or call waits on it longer than a stall, not once a connection is
//! refused, and calls move off it at once. This file is the pure part: what each observation
//! does to a member's state, and the order of members calls try.

use std::time::Duration;

/// What a member is, for the calls that could go to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    /// It answers in time: calls go to it.
    Healthy,
    /// Something it was asked waited past a stall, or its connection failed once: calls go to
    /// another member while one is healthy.
    Suspect,
    /// It has not answered for twice a stall, or its connection failed twice in a row.
    Down,
}

/// The limits a node judges members by, from its lease TTL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limits {
    /// An answer later than this is a stall.
    pub(crate) stall: Duration,
    /// A member comes back as healthy after this many answers in a row within half a stall.
    pub(crate) answers_to_recover: u32,
}

impl Limits {
    /// A tenth of the TTL, within 300 ms and 1 s: a stall is seen (one probe interval plus
    /// this) well before the lease, renewed every fifth of the TTL, could lapse.
    pub(crate) fn for_ttl(ttl: Duration) -> Limits {
        Limits {
            stall: (ttl / 10).clamp(Duration::from_millis(300), Duration::from_secs(1)),
            answers_to_recover: 3,
        }
    }
}

/// What was seen of a member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MemberReply {
    /// It answered after `took`, naming its raft leader (etcd's member id, 0 for none).
    Answered { took: Duration, leader: u64 },
    /// A probe or call to it has waited `waited` so far, unanswered.
    Waiting { waited: Duration },
    /// Its connection failed: refused, reset, closed.
    Failed,
}

/// One member's health.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Member {
    pub(crate) state: State,
    /// Answers in a row within half a stall, toward coming back healthy.
    fast_answers: u32,
    /// Connection failures in a row.
    failures: u32,
    /// A moving average of its answer times, for choosing among healthy members.
    pub(crate) round_trip: Option<Duration>,
}

impl Default for Member {
    /// A member not yet asked counts as healthy: the first calls go to the members in the
    /// order configured, as they did before any probe.
    fn default() -> Self {
        Member {
            state: State::Healthy,
            fast_answers: 0,
            failures: 0,
            round_trip: None,
        }
    }
}

/// `member` after `seen`.
pub(crate) fn observe(member: &Member, seen: MemberReply, limits: &Limits) -> Member {
    let mut next = member.clone();
    match seen {
        MemberReply::Answered { took, leader } => {
            next.failures = 0;
            next.round_trip = Some(match member.round_trip {
                // Weighs the newest answer a quarter: one slow answer moves it, one alone
                // does not decide.
                Some(average) => (average * 3 + took) / 4,
                None => took,
            });
            if took > limits.stall || leader == 0 {
                next.fast_answers = 0;
                if next.state == State::Healthy {
                    next.state = State::Suspect;
                }
            } else if took <= limits.stall / 2 {
                next.fast_answers = member.fast_answers.saturating_add(1);
                if next.fast_answers >= limits.answers_to_recover {
                    next.state = State::Healthy;
                }
            } else {
                // In time, but slow: it keeps its state, and its way back starts again.
                next.fast_answers = 0;
            }
        }
        MemberReply::Waiting { waited } => {
            if waited >= limits.stall * 2 {
                next.state = State::Down;
                next.fast_answers = 0;
            } else if waited >= limits.stall {
                next.fast_answers = 0;
                if next.state == State::Healthy {
                    next.state = State::Suspect;
                }
            }
        }
        MemberReply::Failed => {
            next.fast_answers = 0;
            next.failures = member.failures.saturating_add(1);
            next.state = if next.failures >= 2 {
                State::Down
            } else {
                State::Suspect
            };
        }
    }
    next
}

/// The members in the order calls try them: healthy ones first, the one `preferred` now
/// before the others unless another answers more than twice as fast (calls stay on one member
/// while it serves them well: each move opens streams anew), then by answer time; suspect ones
/// next, down ones last. When none is healthy the order stays `previous`: every member at once
/// is more likely this node's own trouble (a stall of its own, its network) than etcd's.
pub(crate) fn order(members: &[Member], previous: &[usize]) -> Vec<usize> {
    if !members.iter().any(|member| member.state == State::Healthy) {
        return previous.to_vec();
    }
    let rank = |state: State| match state {
        State::Healthy => 0,
        State::Suspect => 1,
        State::Down => 2,
    };
    let preferred = previous
        .first()
        .copied()
        .filter(|&index| members.get(index).is_some_and(|member| member.state == State::Healthy));
    let fastest = members
        .iter()
        .enumerate()
        .filter(|(_, member)| member.state == State::Healthy)
        .filter_map(|(index, member)| member.round_trip.map(|took| (took, index)))
        .min();
    let keep = match (preferred, fastest) {
        (Some(index), Some((fastest, _))) => members[index]
            .round_trip
            .is_none_or(|took| took <= fastest * 2)
            .then_some(index),
        (preferred, _) => preferred,
    };
    let mut indices: Vec<usize> = (0..members.len()).collect();
    indices.sort_by_key(|&index| {
        let member = &members[index];
        (
            rank(member.state),
            Some(index) != keep,
            member.round_trip.unwrap_or(Duration::MAX),
            index,
        )
    });
    indices
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn limits() -> Limits {
        Limits::for_ttl(Duration::from_secs(5))
    }

    fn answered(ms: u32) -> MemberReply {
        MemberReply::Answered {
            took: MS * ms,
            leader: 7,
        }
    }

    fn after(seen: &[MemberReply]) -> Member {
        seen.iter()
            .fold(Member::default(), |member, seen| observe(&member, *seen, &limits()))
    }

    #[test]
    fn the_stall_is_a_tenth_of_the_ttl_within_bounds() {
        assert_eq!(limits().stall, MS * 500);
        assert_eq!(Limits::for_ttl(Duration::from_secs(2)).stall, MS * 300);
        assert_eq!(Limits::for_ttl(Duration::from_secs(60)).stall, Duration::from_secs(1));
    }

    #[test]
    fn a_member_waited_on_past_a_stall_is_suspect_and_past_two_is_down() {
        assert_eq!(
            after(&[MemberReply::Waiting { waited: MS * 499 }]).state,
            State::Healthy
        );
        assert_eq!(
            after(&[MemberReply::Waiting { waited: MS * 500 }]).state,
            State::Suspect
        );
        assert_eq!(after(&[MemberReply::Waiting { waited: MS * 1000 }]).state, State::Down);
        assert_eq!(
            after(&[answered(600)]).state,
            State::Suspect,
            "a late answer is a stall too"
        );
    }

    #[test]
    fn a_connection_failing_twice_in_a_row_is_down() {
        assert_eq!(after(&[MemberReply::Failed]).state, State::Suspect);
        assert_eq!(after(&[MemberReply::Failed, MemberReply::Failed]).state, State::Down);
        assert_eq!(
            after(&[MemberReply::Failed, answered(5), MemberReply::Failed]).state,
            State::Suspect
        );
    }

    #[test]
    fn a_member_without_a_raft_leader_is_suspect() {
        let seen = MemberReply::Answered {
            took: MS * 5,
            leader: 0,
        };
        assert_eq!(after(&[seen]).state, State::Suspect);
    }

    #[test]
    fn a_member_comes_back_after_three_fast_answers_in_a_row() {
        let down = [MemberReply::Waiting { waited: MS * 1000 }];
        let two = [&down[..], &[answered(10), answered(10)]].concat();
        assert_eq!(after(&two).state, State::Down);
        let slow_between = [&two[..], &[answered(300), answered(10)]].concat();
        assert_eq!(
            after(&slow_between).state,
            State::Down,
            "an answer over half a stall starts again"
        );
        let three = [&down[..], &[answered(10), answered(10), answered(10)]].concat();
        assert_eq!(after(&three).state, State::Healthy);
    }

    #[test]
    fn calls_go_to_healthy_members_first_and_stay_on_the_preferred_one() {
        let healthy = |ms| after(&[answered(ms)]);
        let down = after(&[MemberReply::Failed, MemberReply::Failed]);
        let suspect = after(&[MemberReply::Failed]);
        let members = [down.clone(), healthy(20), suspect.clone(), healthy(10)];
        assert_eq!(
            order(&members, &[0, 1, 2, 3]),
            vec![3, 1, 2, 0],
            "the fastest healthy first"
        );
        assert_eq!(
            order(&members, &[1, 3, 2, 0]),
            vec![1, 3, 2, 0],
            "the preferred one kept"
        );
        let members = [healthy(50), healthy(10)];
        assert_eq!(
            order(&members, &[0, 1]),
            vec![1, 0],
            "left once another is over twice as fast"
        );
    }

    #[test]
    fn with_no_member_healthy_the_order_stays() {
        let down = after(&[MemberReply::Failed, MemberReply::Failed]);
        let suspect = after(&[MemberReply::Failed]);
        assert_eq!(order(&[down, suspect], &[1, 0]), vec![1, 0]);
    }
}
