//! Which acquisitions may still land in etcd after their clean-up, and under which session
//! their clean-up must leave a tombstone (review N2 (c)).
//!
//! A write that raft commits after the core's last clean-up of its acquisition would leave
//! an entry on the client's shared session, which lives as long as the client. So a
//! clean-up of an acquisition that may still land writes a tombstone
//! (`<prefix>#retired/<etcd lease>/<lease id>`) on the session that write is attached
//! to, and every write of an entry compares that no tombstone exists for its lease id:
//! one compare more in a transaction that is sent anyway. A tombstone lives with its
//! session's etcd lease, as long as the entries it keeps out.
//!
//! Tombstones are written only where one is needed, so they do not pile up: for an
//! acquisition whose write went unanswered (cancelled, timed out, failed on the wire), on
//! the session it was sent with; and for one this client has never seen answered (a write
//! still on its way from the caller, as in the suite's fault wrapper), on every live
//! shared session, only when its entry is not there. An acquisition whose writes were all
//! answered needs none, which is every lock taken and released without a fault.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, Weak};

use lock_core::backend::lock_unpoisoned as lock;
use lock_core::LeaseId;

use crate::session::EtcdSession;

/// How many acquisitions with answered writes are remembered. One forgotten while still
/// held costs a tombstone if its entry is gone at release (a put in the same transaction).
const ANSWERED_KEPT: usize = 65_536;

/// How many acquisitions with an unanswered write are remembered until their clean-up.
const UNANSWERED_KEPT: usize = 65_536;

/// This client's record of its acquisitions' writes.
#[derive(Debug, Default)]
pub(crate) struct Attempts {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    unanswered: HashMap<LeaseId, Vec<Weak<EtcdSession>>>,
    unanswered_order: VecDeque<LeaseId>,
    answered: HashSet<LeaseId>,
    answered_order: VecDeque<LeaseId>,
}

/// Where a clean-up leaves tombstones.
#[derive(Debug)]
pub(crate) struct Retire {
    /// The sessions to leave one on.
    pub(crate) sessions: Vec<Arc<EtcdSession>>,
    /// Only if the entry is not there (an acquisition never seen: a present entry is the
    /// one any late write would have made, and it is deleted now).
    pub(crate) only_if_absent: bool,
}

impl Attempts {
    /// A write of `lease_id`'s entry with `session`'s lease is about to be sent.
    pub(crate) fn sending(&self, lease_id: LeaseId, session: &Arc<EtcdSession>) -> Sending<'_> {
        Sending {
            attempts: self,
            lease_id,
            session: Arc::downgrade(session),
            answered: false,
        }
    }

    /// Where the clean-up of `lease_id` leaves tombstones; `live_shared` lists the live
    /// shared sessions, asked only for an acquisition this client never saw answered.
    pub(crate) fn retire(
        &self,
        lease_id: LeaseId,
        live_shared: impl FnOnce() -> Vec<Arc<EtcdSession>>,
    ) -> Retire {
        let state = lock(&self.state);
        if let Some(sessions) = state.unanswered.get(&lease_id) {
            return Retire {
                sessions: sessions.iter().filter_map(Weak::upgrade).collect(),
                only_if_absent: false,
            };
        }
        if state.answered.contains(&lease_id) {
            return Retire {
                sessions: Vec::new(),
                only_if_absent: true,
            };
        }
        drop(state);
        Retire {
            sessions: live_shared(),
            only_if_absent: true,
        }
    }

    /// `lease_id`'s clean-up, tombstones included, was answered: no write of it can land.
    pub(crate) fn retired(&self, lease_id: LeaseId) {
        let mut state = lock(&self.state);
        if state.unanswered.remove(&lease_id).is_some() {
            state.unanswered_order.retain(|id| *id != lease_id);
        }
        remember_answered(&mut state, lease_id);
    }
}

fn remember_answered(state: &mut State, lease_id: LeaseId) {
    if state.answered.insert(lease_id) {
        state.answered_order.push_back(lease_id);
        if state.answered_order.len() > ANSWERED_KEPT {
            if let Some(old) = state.answered_order.pop_front() {
                state.answered.remove(&old);
            }
        }
    }
}

/// A write on its way: unless [`answered`](Sending::answered) before it is dropped, its
/// acquisition may still land, and its clean-up leaves a tombstone on its session.
pub(crate) struct Sending<'a> {
    attempts: &'a Attempts,
    lease_id: LeaseId,
    session: Weak<EtcdSession>,
    answered: bool,
}

impl Sending<'_> {
    /// etcd answered the write (applied or refused): it will not land later.
    pub(crate) fn answered(mut self) {
        self.answered = true;
        let mut state = lock(&self.attempts.state);
        remember_answered(&mut state, self.lease_id);
    }
}

impl Drop for Sending<'_> {
    fn drop(&mut self) {
        if self.answered {
            return;
        }
        let mut state = lock(&self.attempts.state);
        let lease_id = self.lease_id;
        match state.unanswered.get_mut(&lease_id) {
            Some(sessions) => {
                if !sessions.iter().any(|s| s.ptr_eq(&self.session)) {
                    sessions.push(self.session.clone());
                }
            }
            None => {
                state
                    .unanswered
                    .insert(lease_id, vec![self.session.clone()]);
                state.unanswered_order.push_back(lease_id);
                if state.unanswered_order.len() > UNANSWERED_KEPT {
                    if let Some(old) = state.unanswered_order.pop_front() {
                        state.unanswered.remove(&old);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leases(retire: &Retire) -> Vec<i64> {
        retire.sessions.iter().map(|s| s.lease).collect()
    }

    #[test]
    fn only_unanswered_or_unseen_acquisitions_leave_tombstones() {
        let attempts = Attempts::default();
        let (sent_with, other) = (
            Arc::new(EtcdSession::detached(7)),
            Arc::new(EtcdSession::detached(8)),
        );
        let live = || vec![Arc::clone(&sent_with), Arc::clone(&other)];

        // Answered: nothing to keep out.
        let answered = LeaseId::random();
        attempts.sending(answered, &sent_with).answered();
        let retire = attempts.retire(answered, live);
        assert!(retire.sessions.is_empty());

        // Unanswered (dropped on the way), even after a retry was answered: on the
        // session it was sent with, entry or not.
        let unanswered = LeaseId::random();
        drop(attempts.sending(unanswered, &sent_with));
        attempts.sending(unanswered, &sent_with).answered();
        let retire = attempts.retire(unanswered, live);
        assert_eq!((leases(&retire), retire.only_if_absent), (vec![7], false));
        // Once its clean-up was answered, later clean-ups need none.
        attempts.retired(unanswered);
        assert!(attempts.retire(unanswered, live).sessions.is_empty());

        // Never seen: on every live shared session, only if the entry is gone.
        let unseen = LeaseId::random();
        let retire = attempts.retire(unseen, live);
        assert_eq!((leases(&retire), retire.only_if_absent), (vec![7, 8], true));
    }

    #[test]
    fn the_record_is_bounded() {
        let attempts = Attempts::default();
        let session = Arc::new(EtcdSession::detached(7));
        let first = LeaseId::random();
        attempts.sending(first, &session).answered();
        for _ in 0..ANSWERED_KEPT {
            attempts.sending(LeaseId::random(), &session).answered();
        }
        let state = lock(&attempts.state);
        assert_eq!(state.answered.len(), ANSWERED_KEPT);
        assert!(!state.answered.contains(&first));
    }
}
