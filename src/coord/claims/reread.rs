//! After a claim etcd refused, or whose outcome is unknown: the records read again, and each
//! want settled by what they say.

use std::sync::Arc;

use super::{Book, Claimer, Halt};
use crate::coord::ledger;
use crate::rules::protocol::{after_reread, Reread, Want, Won};
use crate::rules::record::Claim;

impl Claimer<'_> {
    /// After a write that was refused or whose outcome is unknown: reads the records again and
    /// settles each want by what they say. Returns the wants to write again.
    pub(super) async fn read_outcome(
        &self,
        book: &mut Book,
        wants: &mut Vec<Want>,
        intended: Vec<Option<Claim>>,
        won: &mut Vec<Won>,
        riding_starts: &mut Vec<(String, std::time::Instant)>,
    ) -> Result<Vec<Want>, Halt> {
        let names: Vec<&str> = wants
            .iter()
            .map(|want| book.entries[want.index].job.name.as_str())
            .collect();
        let seen = self
            .retry(|| ledger::read_claims(self.session, self.keys, &names))
            .await?;
        let mut open = Vec::new();
        for ((want, intended), seen) in wants.drain(..).zip(intended).zip(seen) {
            let index = want.index;
            let expected = book.entries[index].revision;
            let job = book.entries[index].job.name.clone();
            let carries_starts = riding_starts.iter().any(|(riding, _)| *riding == job);
            let spec = Arc::clone(&book.entries[index].job);
            match after_reread(&spec, want, &seen, expected, intended, carries_starts) {
                Reread::Won {
                    want,
                    record,
                    earlier: false,
                } => self.won(book, want, record, seen.mod_revision, won),
                Reread::Won {
                    want,
                    record,
                    earlier: true,
                } => {
                    tracing::info!(job = %job, "an earlier attempt of this claim landed late: its ticks are ours; the starts since are written again");
                    let (rewrite, riding): (Vec<_>, Vec<_>) =
                        riding_starts.drain(..).partition(|(riding, _)| *riding == job);
                    *riding_starts = riding;
                    self.starts.unrecord(rewrite);
                    self.won(book, want, record, seen.mod_revision, won);
                }
                Reread::Open(want) => open.push(want),
                Reread::Changed { again, taken } => {
                    book.learn(index, &seen);
                    if taken > 0 {
                        tracing::info!(job = %job, "tick already claimed by another leader: not running it here");
                    }
                    // The starts riding this write are written over the new record, or that
                    // leader's write keeps them listed and a later leader runs them again.
                    open.extend(again);
                }
            }
        }
        Ok(open)
    }
}
