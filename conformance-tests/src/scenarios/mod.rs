//! Every scenario of the suite, with the capability it needs and the guarantee it proves.

use std::future::Future;
use std::pin::Pin;

use lock_core::{Capabilities, Liveness};

use crate::harness::{BackendFactory, Ctx, Outcome};

pub mod cleanup;
pub mod election;
pub mod exclusion;
pub mod idempotent;
pub mod input;
pub mod loss;
pub mod operator;
pub mod outages;
pub mod ownership;
pub mod patterns;
pub mod processes;
pub mod recovery;
pub mod renewal;
pub mod sessions;
pub mod sets;
pub mod shared;
pub mod waiting;

/// What a backend under test offers: its capabilities, and what its factory can build.
#[derive(Clone, Debug)]
pub struct Offers {
    /// The backend's declared capabilities.
    pub capabilities: Capabilities,
    /// The factory builds clients of an unreachable store.
    pub unreachable_client: bool,
    /// The factory builds clients whose link to the store can be cut or slowed.
    pub link: bool,
    /// The factory runs servers the outage scenarios can start privately and control.
    pub servers: bool,
    /// The factory's servers authenticate clients, and it names a user to refuse.
    pub wrong_password: bool,
    /// The factory counts the requests that can renew leases on a store of its own.
    pub renewal_requests: bool,
    /// The factory can end a holder's session from the store's side.
    pub session_end: bool,
    /// The factory names a URL by which another process reaches the same store.
    pub other_process: bool,
}

impl Offers {
    /// Asks `factory` what it offers.
    pub async fn probe(factory: &dyn BackendFactory) -> lock_core::Result<Offers> {
        let backend = factory.connect().await?;
        let link = match factory.connect_with_link().await {
            Some(connected) => {
                connected?;
                true
            }
            None => false,
        };
        Ok(Offers {
            capabilities: backend.capabilities().clone(),
            unreachable_client: factory.connect_unreachable().await.is_some(),
            link,
            servers: factory.servers().is_some(),
            wrong_password: factory
                .servers()
                .is_some_and(|servers| servers.store().wrong_password.is_some()),
            renewal_requests: factory.counts_renewal_requests(),
            session_end: factory.session_ender().is_some(),
            other_process: factory.process_url().is_some(),
        })
    }
}

/// What a scenario needs from the backend before it can be registered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Needs {
    /// Every backend.
    Nothing,
    /// [`Capabilities::fair_ordering`].
    FairOrdering,
    /// [`Capabilities::native_notification`]: waiters are woken by the store.
    Notification,
    /// Leases that live by their own TTL and renewals ([`Liveness::PerLease`] or
    /// [`Liveness::Batched`]): faults on [`Op::Renew`](crate::Op::Renew) stop renewals,
    /// and a grant whose reply comes after its TTL is over. A session backend's leases
    /// live by their session's keep-alives instead; the session scenarios prove the same
    /// guarantees for it by cutting its link.
    LeaseTtl,
    /// [`Liveness::Session`]: leases are bound to store sessions.
    SessionBound,
    /// [`Liveness::Session`], and a factory that can cut or slow a client's link.
    SessionLink,
    /// [`Liveness::Session`], and a factory that can end a holder's session from the
    /// store's side ([`BackendFactory::session_ender`]).
    SessionEnd,
    /// [`Capabilities::reentrancy`].
    Reentrancy,
    /// A factory that can build a client of an unreachable store.
    UnreachableClient,
    /// A factory that can cut or slow a client's link (any liveness).
    Link,
    /// A factory whose store runs as servers it can start privately, pause, kill and
    /// restart.
    Servers,
    /// Servers that authenticate clients, and a user the factory can name with a wrong
    /// password.
    WrongPassword,
    /// [`Liveness::Batched`], and a factory that counts the requests that can renew leases
    /// ([`BackendFactory::counted_store`]).
    BatchedRenewal,
    /// A store another process can reach ([`BackendFactory::process_url`]).
    OtherProcess,
    /// [`Capabilities::records`]: idempotency records.
    Records,
    /// No [`Capabilities::records`]: the refusal is what is checked.
    NoRecords,
    /// [`Capabilities::once_holds`]: holds that live by their TTL alone (once tickets).
    OnceHolds,
    /// No [`Capabilities::once_holds`]: the refusal is what is checked.
    NoOnceHolds,
    /// [`Capabilities::shared_holds`]: semaphores and reader-writer locks.
    SharedHolds,
    /// No [`Capabilities::shared_holds`]: the refusal is what is checked.
    NoSharedHolds,
    /// [`Capabilities::atomic_sets`]: lock sets taken in one store step.
    AtomicSets,
}

impl Needs {
    /// `Ok` when the scenario applies, or why it does not.
    pub fn check(self, offers: &Offers) -> Result<(), &'static str> {
        let caps = &offers.capabilities;
        match self {
            Needs::Nothing => Ok(()),
            Needs::OnceHolds if !caps.once_holds() => {
                Err("every hold is bound to a session: no hold lives by its TTL alone")
            }
            Needs::NoOnceHolds if caps.once_holds() => {
                Err("holds can live by their TTL alone: once tickets work")
            }
            Needs::FairOrdering if !caps.fair_ordering => {
                Err("no fair ordering: waiters are not queued")
            }
            Needs::Notification if !caps.native_notification => {
                Err("no native notification: waiters only poll")
            }
            Needs::LeaseTtl if caps.liveness == Liveness::Session => Err(
                "leases live by their session, not their own TTL (the session scenarios cover it)",
            ),
            Needs::SessionBound | Needs::SessionLink | Needs::SessionEnd
                if caps.liveness != Liveness::Session =>
            {
                Err("leases are not bound to sessions")
            }
            Needs::SessionEnd if !offers.session_end => {
                Err("the factory cannot end a session from the store's side")
            }
            Needs::SessionLink if !offers.link => Err("the factory cannot cut a client's link"),
            Needs::Reentrancy if !caps.reentrancy => Err("reentrant owners are unsupported"),
            Needs::UnreachableClient if !offers.unreachable_client => {
                Err("embedded store: nothing to be unreachable")
            }
            Needs::Link if !offers.link => Err("the factory cannot cut a client's link"),
            Needs::Servers if !offers.servers => {
                Err("embedded store: no server to freeze or restart")
            }
            Needs::WrongPassword if !offers.wrong_password => {
                Err("the test servers do not authenticate clients")
            }
            Needs::BatchedRenewal if caps.liveness != Liveness::Batched => {
                Err("leases are not renewed in batches")
            }
            Needs::BatchedRenewal if !offers.renewal_requests => {
                Err("the factory cannot count renewal requests")
            }
            Needs::OtherProcess if !offers.other_process => {
                Err("the store lives inside the test process: no other process can reach it")
            }
            Needs::SharedHolds if !caps.shared_holds => {
                Err("the store keeps no semaphores or reader-writer locks")
            }
            Needs::NoSharedHolds if caps.shared_holds => {
                Err("the store keeps semaphores and reader-writer locks")
            }
            Needs::AtomicSets if !caps.atomic_sets => {
                Err("the store takes a lock set one key at a time")
            }
            Needs::Records if !caps.records => Err("the store keeps no idempotency records"),
            Needs::NoRecords if caps.records => {
                Err("the store keeps idempotency records (the record scenarios cover it)")
            }
            _ => Ok(()),
        }
    }
}

/// A boxed scenario run.
pub type ScenarioFuture<'a> = Pin<Box<dyn Future<Output = Outcome> + Send + 'a>>;

/// One named scenario.
#[derive(Clone, Copy)]
pub struct Scenario {
    /// The test name after `conformance::`.
    pub name: &'static str,
    /// What the backend must offer for the scenario to be registered (all of it).
    pub needs: &'static [Needs],
    /// Runs it.
    pub run: for<'a> fn(&'a Ctx) -> ScenarioFuture<'a>,
}

impl Scenario {
    /// Why the scenario does not apply to a backend offering `offers`, if it does not.
    pub fn not_applicable(&self, offers: &Offers) -> Option<&'static str> {
        self.needs
            .iter()
            .find_map(|needs| needs.check(offers).err())
    }
}

macro_rules! scenarios {
    ($($module:ident :: $name:ident => $($needs:ident)&+),+ $(,)?) => {
        /// Every scenario, in the order they are reported.
        pub const ALL: &[Scenario] = &[$(Scenario {
            name: stringify!($name),
            needs: &[$(Needs::$needs),+],
            run: |ctx| Box::pin($module::$name(ctx)),
        }),+];
    };
}

scenarios! {
    exclusion::mutual_exclusion => Nothing,
    exclusion::history_is_serial_with_increasing_tokens => Nothing,
    exclusion::tokens_strictly_increase => Nothing,
    exclusion::stale_holder_is_fenced_out => Nothing,
    ownership::only_the_owner_releases => Nothing,
    ownership::only_the_owner_renews => Nothing,
    ownership::expiry_then_takeover => Nothing,
    ownership::expired_lease_is_lost_even_if_untaken => Nothing,
    ownership::release_is_idempotent => Nothing,
    renewal::renewal_keeps_lock_across_ten_ttls => Nothing,
    renewal::no_zombie_renewal_after_release => LeaseTtl,
    renewal::lost_signal_precedes_takeover => LeaseTtl,
    renewal::manual_renewal_extends_then_expires => Nothing,
    waiting::try_lock_returns_at_once => Nothing,
    waiting::bounded_wait_times_out => Nothing,
    waiting::waiter_wakes_promptly_after_release => Nothing,
    waiting::waiters_take_turns_promptly => Nothing,
    waiting::waiter_wakes_despite_dropped_notification => Notification,
    waiting::fifo_order_with_dead_waiter => FairOrdering,
    waiting::queued_wait_times_out_while_its_attempt_is_slow => FairOrdering,
    waiting::queued_wait_times_out_while_its_leave_is_slow => FairOrdering,
    waiting::subscription_setup_is_bounded_by_the_wait => Notification,
    recovery::reentrancy_accounting => Reentrancy,
    recovery::owner_tasks_keep_their_own_bounds => Reentrancy,
    recovery::stillborn_grant_is_never_handed_out => LeaseTtl,
    recovery::phantom_hold_of_a_retried_acquire_is_released => Nothing,
    recovery::cancelled_release_still_releases => Nothing,
    recovery::cancelled_acquire_leaves_nothing_held => Nothing,
    recovery::late_landing_acquire_is_released => Nothing,
    recovery::ambiguous_acquire_resolves_on_retry => Nothing,
    recovery::ambiguous_release_resolves_on_retry => Nothing,
    recovery::unavailable_store_is_retryable_and_recovers => Nothing,
    recovery::unreachable_store_reports_unavailable => UnreachableClient,
    cleanup::waiter_that_gave_up_during_an_outage_leaves_the_queue => FairOrdering,
    cleanup::release_that_failed_until_the_deadline_is_retried => SessionBound,
    sessions::session_expiry_loses_every_lease_before_a_rival_is_granted => SessionLink,
    sessions::disconnected_session_stops_extending_the_deadline => SessionLink,
    sessions::keep_alive_is_measured_from_its_send => SessionLink,
    patterns::once_window_holds_for_at_least => OnceHolds,
    patterns::once_window_frees_at_at_most_after_a_crash => OnceHolds,
    patterns::once_window_outlives_its_client => OnceHolds,
    patterns::once_ticket_never_renews => OnceHolds,
    patterns::once_window_bounds_are_checked => Nothing,
    patterns::once_window_is_refused_on_a_session_store => NoOnceHolds,
    patterns::with_lock_returns_the_body_value_and_releases => Nothing,
    patterns::with_lock_stops_its_body_when_renewals_fail => LeaseTtl,
    patterns::with_lock_stops_its_body_when_the_session_ends => SessionLink,
    patterns::local_waiters_are_one_remote_waiter_in_fifo_order => Nothing,
    patterns::local_handoff_is_opt_in_and_shares_the_token => Nothing,
    idempotent::idempotent_work_runs_once_across_concurrent_callers => Records,
    idempotent::idempotent_replay_returns_the_recorded_result => Records,
    idempotent::idempotent_mismatch_is_refused => Records,
    idempotent::idempotent_in_progress_and_failed_runs => Records,
    idempotent::record_write_needs_the_live_holder => Records,
    idempotent::record_retention_is_bounded => Records,
    idempotent::late_record_of_a_lost_holder_is_refused => Records & LeaseTtl,
    idempotent::late_record_of_a_holder_whose_session_ended_is_refused => Records & SessionLink,
    idempotent::idempotent_is_refused_without_records => NoRecords,
    input::invalid_keys_are_refused => Nothing,
    input::invalid_ttls_are_refused => Nothing,
    input::extreme_options_are_refused_or_work => Nothing,
    input::hostile_keys_stay_in_their_namespace => Nothing,
    input::ten_thousand_keys_held_at_once => Nothing,
    input::resource_hygiene => Nothing,
    operator::operator_lists_and_breaks_held_keys => Nothing,
    outages::partition_longer_than_the_ttl_loses_before_a_rival_is_granted => Link,
    outages::late_grant_is_never_handed_out => LeaseTtl & Link,
    outages::frozen_server_is_unavailable_then_recovers => Servers,
    outages::restarted_server_keeps_tokens_increasing => Servers,
    outages::silent_store_is_unavailable_within_the_connect_timeout => Servers,
    outages::wrong_password_is_permission_denied => WrongPassword,
    outages::automatic_renewals_are_batched => BatchedRenewal,
    processes::killed_holder_process_hands_over_to_a_waiter => OtherProcess,
    loss::failing_renewals_warn_before_the_loss => LeaseTtl,
    loss::broken_lease_is_lost_as_not_held => LeaseTtl,
    loss::max_hold_ends_the_hold_and_frees_the_key => Nothing,
    loss::shutdown_frees_every_key_at_once => Nothing,
    loss::cut_session_link_warns_before_the_loss => SessionLink,
    loss::session_ended_by_the_store_is_lost_as_session_ended => SessionEnd,
    shared::semaphore_never_admits_more_than_its_limit => SharedHolds,
    shared::semaphore_admits_exactly_its_limit => SharedHolds,
    shared::semaphore_limit_disagreement_is_refused => SharedHolds,
    shared::crashed_permit_holder_frees_its_permit_by_ttl => SharedHolds,
    shared::permit_loss_precedes_the_rivals_grant => SharedHolds & LeaseTtl,
    shared::readers_share_and_writers_exclude => SharedHolds,
    shared::readers_and_writers_never_overlap => SharedHolds,
    shared::waiting_writer_is_not_starved_by_readers => SharedHolds,
    shared::cancelled_shared_acquisitions_leave_nothing => SharedHolds,
    shared::owner_downgrades_but_never_upgrades => SharedHolds & Reentrancy,
    shared::shared_holds_are_refused_cleanly => NoSharedHolds,
    shared::cut_off_permit_holder_loses_before_a_rival_is_granted => SharedHolds & Link,
    sets::lock_set_is_all_or_none => Nothing,
    sets::lock_sets_in_opposite_orders_do_not_deadlock => Nothing,
    sets::cancelled_lock_set_leaves_nothing => Nothing,
    sets::lost_member_fires_the_sets_lost => LeaseTtl,
    sets::atomic_lock_set_waits_holding_nothing => AtomicSets,
    election::one_leader_at_a_time_with_increasing_terms => Records,
    election::leader_loses_before_a_successor_is_elected => Records & LeaseTtl,
    election::resigned_leader_is_replaced_at_once => Records,
    election::observe_follows_the_terms_and_ends_on_the_current_leader => Records,
    election::cancelled_campaign_leaves_no_candidate => Records,
    election::election_is_refused_without_records => NoRecords,
    election::cut_off_leader_loses_before_a_successor_is_elected => Records & Link,
}
