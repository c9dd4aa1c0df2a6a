//! Every scenario of the suite, with the capability it needs and the guarantee it proves.

use std::future::Future;
use std::pin::Pin;

use lock_core::Capabilities;

use crate::harness::{Ctx, Outcome};

pub mod exclusion;
pub mod input;
pub mod ownership;
pub mod recovery;
pub mod renewal;
pub mod waiting;

/// What a scenario needs from the backend before it can be registered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Needs {
    /// Every backend.
    Nothing,
    /// [`Capabilities::fair_ordering`].
    FairOrdering,
    /// [`Capabilities::native_notification`] used by the core's waiting loop (a fair
    /// backend's own queue wakes its waiters without it).
    NotifiedPolling,
    /// The core's own polling loop, which retries an unanswered attempt with the same
    /// lease id (a fair backend waits in its own queue instead).
    CorePolling,
    /// [`Capabilities::reentrancy`].
    Reentrancy,
    /// A factory that can build a client of an unreachable store.
    UnreachableClient,
}

impl Needs {
    /// `Ok` when the scenario applies, or why it does not.
    pub fn check(
        self,
        caps: &Capabilities,
        has_unreachable_client: bool,
    ) -> Result<(), &'static str> {
        match self {
            Needs::Nothing => Ok(()),
            Needs::FairOrdering if !caps.fair_ordering => {
                Err("no fair ordering: waiters are not queued")
            }
            Needs::NotifiedPolling if !caps.native_notification => {
                Err("no native notification: waiters only poll")
            }
            Needs::NotifiedPolling if caps.fair_ordering => {
                Err("its fair queue wakes waiters, not notifications")
            }
            Needs::CorePolling if caps.fair_ordering => {
                Err("its fair queue waits in the store: the core does not retry its attempts")
            }
            Needs::Reentrancy if !caps.reentrancy => Err("reentrant owners are unsupported"),
            Needs::UnreachableClient if !has_unreachable_client => {
                Err("embedded store: nothing to be unreachable")
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
    /// What the backend must offer for the scenario to be registered.
    pub needs: Needs,
    /// Runs it.
    pub run: for<'a> fn(&'a Ctx) -> ScenarioFuture<'a>,
}

macro_rules! scenarios {
    ($($module:ident :: $name:ident => $needs:ident),+ $(,)?) => {
        /// Every scenario, in the order they are reported.
        pub const ALL: &[Scenario] = &[$(Scenario {
            name: stringify!($name),
            needs: Needs::$needs,
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
    renewal::no_zombie_renewal_after_release => Nothing,
    renewal::lost_signal_precedes_takeover => Nothing,
    renewal::manual_renewal_extends_then_expires => Nothing,
    waiting::try_lock_returns_at_once => Nothing,
    waiting::bounded_wait_times_out => Nothing,
    waiting::waiter_wakes_promptly_after_release => Nothing,
    waiting::waiters_take_turns_promptly => Nothing,
    waiting::waiter_wakes_despite_dropped_notification => NotifiedPolling,
    waiting::fifo_order_with_dead_waiter => FairOrdering,
    waiting::subscription_setup_is_bounded_by_the_wait => NotifiedPolling,
    recovery::reentrancy_accounting => Reentrancy,
    recovery::owner_tasks_keep_their_own_bounds => Reentrancy,
    recovery::stillborn_grant_is_never_handed_out => Nothing,
    recovery::phantom_hold_of_a_retried_acquire_is_released => CorePolling,
    recovery::cancelled_release_still_releases => Nothing,
    recovery::cancelled_acquire_leaves_nothing_held => Nothing,
    recovery::late_landing_acquire_is_released => Nothing,
    recovery::ambiguous_acquire_resolves_on_retry => Nothing,
    recovery::ambiguous_release_resolves_on_retry => Nothing,
    recovery::unavailable_store_is_retryable_and_recovers => Nothing,
    recovery::unreachable_store_reports_unavailable => UnreachableClient,
    input::invalid_keys_are_refused => Nothing,
    input::invalid_ttls_are_refused => Nothing,
    input::extreme_options_are_refused_or_work => Nothing,
    input::hostile_keys_stay_in_their_namespace => Nothing,
    input::ten_thousand_keys_held_at_once => Nothing,
    input::resource_hygiene => Nothing,
}
