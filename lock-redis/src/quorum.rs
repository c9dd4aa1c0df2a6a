//! Majorities of independent nodes: how many decide, and what the nodes' answers to one
//! request on one lease add up to. Redlock decides every operation with it; the release
//! notifications use it to tell when a release is news.

use std::collections::HashMap;
use std::time::Duration;

use lock_core::backend::Ownership;
use lock_core::{Error, ErrorKind, LeaseId, Result};

use crate::entry::{Entry, Held};

/// A majority of a fixed set of nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Quorum {
    nodes: usize,
}

impl Quorum {
    /// The majority of `nodes` nodes.
    pub(crate) fn of(nodes: usize) -> Self {
        Quorum { nodes }
    }

    /// How many nodes make a majority: any two majorities share a node.
    pub(crate) fn needed(self) -> usize {
        self.nodes / 2 + 1
    }

    /// Whether `count` nodes are a majority.
    pub(crate) fn reached(self, count: usize) -> bool {
        count >= self.needed()
    }

    /// What the nodes' answers to an owner-only request on one lease (renew, release)
    /// mean for the lease: [`Ownership::Held`] when a majority did it;
    /// [`Ownership::NotHeld`] when not even every silent node doing it would make a majority (the lease is not live); otherwise
    /// undecided, [`ErrorKind::Unavailable`] naming how many answered.
    pub(crate) fn decide(
        self,
        what: &str,
        answers: impl IntoIterator<Item = Result<Ownership>>,
    ) -> Result<Ownership> {
        let (mut done, mut refused, mut errors) = (0, 0, Vec::new());
        for answer in answers {
            match answer {
                Ok(Ownership::Held) => done += 1,
                Ok(Ownership::NotHeld) => refused += 1,
                Err(err) => errors.push(err),
            }
        }
        if self.reached(done) {
            Ok(Ownership::Held)
        } else if !self.reached(done + errors.len()) {
            Ok(Ownership::NotHeld)
        } else {
            Err(self.missed(what, done + refused, errors))
        }
    }

    /// The holder of a key as the nodes' entries report it: the lease a majority holds,
    /// with the highest token any of them recorded, held for as long as a majority still
    /// keeps it. `None` when no lease is on a majority; undecided (as in
    /// [`decide`](Self::decide)) when fewer than a majority answered.
    pub(crate) fn holder(
        self,
        what: &str,
        answers: impl IntoIterator<Item = Result<Option<Held>>>,
    ) -> Result<Option<Held>> {
        let mut holders: HashMap<LeaseId, (u64, Vec<Duration>, Option<String>)> = HashMap::new();
        let (mut answered, mut errors) = (0, Vec::new());
        for answer in answers {
            match answer {
                Ok(held) => {
                    answered += 1;
                    if let Some(Held {
                        entry,
                        remaining_ttl,
                        label,
                    }) = held
                    {
                        let holder = holders.entry(entry.lease_id).or_default();
                        holder.0 = holder.0.max(entry.token);
                        holder.1.push(remaining_ttl);
                        // Every entry of one lease carries the lease's label.
                        holder.2 = holder.2.take().or(label);
                    }
                }
                Err(err) => errors.push(err),
            }
        }
        if !self.reached(answered) {
            return Err(self.missed(what, answered, errors));
        }
        let needed = self.needed();
        Ok(holders
            .into_iter()
            .find(|(_, (_, ttls, _))| self.reached(ttls.len()))
            .map(|(lease_id, (token, mut ttls, label))| {
                // The majority with the longest TTLs is the last to let go.
                ttls.sort_unstable_by(|a, b| b.cmp(a));
                Held {
                    entry: Entry { lease_id, token },
                    remaining_ttl: ttls[needed - 1],
                    label,
                }
            }))
    }

    /// [`ErrorKind::Unavailable`]: only `answered` nodes answered `what`, with the first
    /// node error as source. A refused permission is passed on as it is, since retrying
    /// cannot help.
    pub(crate) fn missed(self, what: &str, answered: usize, errors: Vec<Error>) -> Error {
        let message = format!(
            "{what}: only {answered} of {} Redis nodes answered, {} needed",
            self.nodes,
            self.needed()
        );
        match errors.into_iter().next() {
            Some(first) if first.kind() == ErrorKind::PermissionDenied => first,
            Some(first) => Error::new(ErrorKind::Unavailable, message).with_source(first),
            None => Error::new(ErrorKind::Unavailable, message),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unanswered() -> Error {
        Error::new(ErrorKind::Unavailable, "no answer")
    }

    fn silent() -> Result<Ownership> {
        Err(unanswered())
    }

    #[test]
    fn majorities() {
        let needed: Vec<usize> = (1..=6).map(|n| Quorum::of(n).needed()).collect();
        assert_eq!(needed, [1, 2, 2, 3, 3, 4]);
    }

    #[test]
    fn a_lease_is_live_on_a_majority_gone_when_no_majority_can_hold_it() {
        let five = Quorum::of(5);
        let decide = |answers: Vec<Result<Ownership>>| five.decide("renew", answers);
        let (held, gone) = (Ok(Ownership::Held), Ok(Ownership::NotHeld));
        let answers = vec![
            held.clone(),
            held.clone(),
            held.clone(),
            gone.clone(),
            silent(),
        ];
        assert_eq!(decide(answers).unwrap(), Ownership::Held);
        let answers = vec![
            held.clone(),
            gone.clone(),
            gone.clone(),
            gone.clone(),
            silent(),
        ];
        assert_eq!(decide(answers).unwrap(), Ownership::NotHeld);
        let undecided = decide(vec![held.clone(), held.clone(), gone, silent(), silent()]);
        assert_eq!(undecided.unwrap_err().kind(), ErrorKind::Unavailable);
        let denied = five.decide(
            "renew",
            vec![
                Err(Error::new(ErrorKind::PermissionDenied, "NOPERM")),
                silent(),
                silent(),
                held.clone(),
                held,
            ],
        );
        assert_eq!(denied.unwrap_err().kind(), ErrorKind::PermissionDenied);
    }

    #[test]
    fn the_holder_is_the_lease_on_a_majority_until_the_majority_lets_go() {
        let (lease, other) = (LeaseId::from_u128(1), LeaseId::from_u128(2));
        let held = |lease_id, token, ms| {
            Ok(Some(Held {
                entry: Entry { lease_id, token },
                remaining_ttl: Duration::from_millis(ms),
                label: None,
            }))
        };
        let three = Quorum::of(3);
        let holder = three
            .holder(
                "inspect",
                vec![held(lease, 4, 900), held(lease, 5, 700), Ok(None)],
            )
            .unwrap()
            .expect("held on two of three");
        assert_eq!(
            holder.entry,
            Entry {
                lease_id: lease,
                token: 5
            }
        );
        assert_eq!(holder.remaining_ttl, Duration::from_millis(700));
        let split = three.holder(
            "inspect",
            vec![held(lease, 4, 900), held(other, 5, 700), Ok(None)],
        );
        assert_eq!(split.unwrap(), None);
        let unanswered = three.holder(
            "inspect",
            vec![held(lease, 4, 900), Err(unanswered()), Err(unanswered())],
        );
        assert_eq!(unanswered.unwrap_err().kind(), ErrorKind::Unavailable);
    }
}
