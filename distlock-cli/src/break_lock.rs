//! `distlock break`: release a stuck key's holder, named by its fencing token.

use distlock::{ErrorKind, FencingToken, LockKey};
use serde_json::json;

use crate::cli::BreakArgs;
use crate::failure::{describe, Failure, NOT_BROKEN};
use crate::store;

/// Releases the holder of `--token` on the key: 0 when it was released, [`NOT_BROKEN`]
/// when the key is free or held under another token (nothing is touched then).
pub async fn break_lock(args: BreakArgs, store_url: &str) -> Result<u8, Failure> {
    // Checked here: past this point the library's `InvalidInput` means "not held".
    LockKey::new(&args.key).map_err(|err| Failure::from_store_error(&err, store_url))?;
    let client = store::connect(store_url).await?;
    let token = FencingToken::new(args.token);
    let refusal = match client.break_lock(&args.key, token).await {
        Ok(()) => None,
        Err(err) => match err.kind() {
            ErrorKind::HeldByAnother => Some(("moved on", err)),
            ErrorKind::InvalidInput => Some(("free", err)),
            _ => return Err(Failure::from_store_error(&err, store_url)),
        },
    };
    let key = args.key.as_str();
    if args.json {
        let object = match &refusal {
            None => json!({ "key": key, "token": token.get(), "broken": true }),
            Some((reason, _)) => {
                json!({ "key": key, "token": token.get(), "broken": false, "reason": reason })
            }
        };
        println!("{object}");
    }
    match refusal {
        None => {
            if !args.json {
                println!("{key}: broken, the holder of token {token} was released");
            }
            Ok(0)
        }
        Some((_, err)) => {
            // "not broken" says what the kind would (an "invalid input" here is no mistake
            // of the caller's: the key is free).
            let line = describe(&err, store_url);
            let kind = format!("{}: ", err.kind());
            let reason = line.strip_prefix(&kind).unwrap_or(&line);
            Err(Failure::new(NOT_BROKEN, format!("not broken: {reason}")))
        }
    }
}
