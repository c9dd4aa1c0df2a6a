//! What an operator can do about a stuck key: list what is held, and break one holder by
//! its fencing token.

use lock_core::{ErrorKind, FencingToken};

use crate::ensure;
use crate::harness::{expect_kind, Ctx, Outcome};

/// `list` shows exactly the held keys under a prefix with their tokens (and labels where
/// the store keeps them), and `break_lock` releases a holder named by its token: refused
/// for a token that moved on or a free key, and the broken holder's own release then
/// reports `Lost`, while the next holder gets a greater token.
pub async fn operator_lists_and_breaks_held_keys(ctx: &Ctx) -> Outcome {
    let prefix = ctx.key("ops/");
    let (a, b) = (ctx.key("ops/a"), ctx.key("ops/b"));
    let outside = ctx.key("other");
    let holder = ctx.client().await?;
    let operator = ctx.client().await?;
    let guard_a = holder.lock(&a).holder_label("worker-7").await?;
    let guard_b = holder.lock(&b).await?;
    let guard_outside = holder.lock(&outside).await?;
    let listed = operator.list(&prefix, 100).await?;
    let seen: Vec<(&str, FencingToken)> = listed
        .iter()
        .map(|(key, status)| (key.as_str(), status.token))
        .collect();
    ensure!(
        seen == [(a.as_str(), guard_a.token()), (b.as_str(), guard_b.token())],
        "list({prefix:?}) showed {seen:?}"
    );
    let first = operator.list(&prefix, 1).await?;
    ensure!(
        first.len() == 1 && first[0].0.as_str() == a,
        "list with a limit of 1 showed {first:?}"
    );
    if let Some(label) = &listed[0].1.holder {
        ensure!(label == "worker-7", "list showed the label {label:?}");
    }
    let stale = FencingToken::new(guard_a.token().get().saturating_sub(1));
    expect_kind(
        operator.break_lock(&a, stale).await,
        ErrorKind::HeldByAnother,
        "breaking with a token the lock has moved on from",
    )?;
    ensure!(guard_a.is_held(), "a refused break touched the holder");
    operator.break_lock(&a, guard_a.token()).await?;
    let next = operator.try_lock(&a).await?;
    ensure!(
        next.token() > guard_a.token(),
        "the next holder's token {} is not above the broken one's {}",
        next.token(),
        guard_a.token()
    );
    expect_kind(
        guard_a.release().await,
        ErrorKind::Lost,
        "the broken holder's release",
    )?;
    let next_token = next.token();
    next.release().await?;
    expect_kind(
        operator.break_lock(&a, next_token).await,
        ErrorKind::InvalidInput,
        "breaking a free key",
    )?;
    let listed = operator.list(&prefix, 100).await?;
    ensure!(
        listed.len() == 1 && listed[0].0.as_str() == b,
        "after the break, list showed {listed:?}"
    );
    guard_b.release().await?;
    guard_outside.release().await?;
    Ok(())
}
