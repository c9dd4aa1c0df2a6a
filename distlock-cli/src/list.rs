//! `distlock list`: the held keys, never with a holder's lease id.

use distlock::ErrorKind;
use serde_json::json;

use crate::cli::ListArgs;
use crate::failure::Failure;
use crate::status::{as_json, as_line};
use crate::store;

/// Lists the held keys starting with the prefix, at most `--limit` of them; 0 once listed.
pub async fn list(args: ListArgs, store_url: &str) -> Result<u8, Failure> {
    let client = store::connect(store_url).await?;
    let prefix = args.prefix.as_deref().unwrap_or("");
    let limit = usize::try_from(args.limit).unwrap_or(usize::MAX);
    // One more than shown: whether it comes back tells that the limit cut the list.
    let mut held = client
        .list(prefix, limit.saturating_add(1))
        .await
        .map_err(|err| {
            let mut failure = Failure::from_store_error(&err, store_url);
            if err.kind() == ErrorKind::Unsupported {
                failure
                    .message
                    .push_str("; `distlock status KEY` still looks up a key you know");
            }
            failure
        })?;
    let truncated = held.len() > limit;
    held.truncate(limit);
    if args.json {
        let keys: Vec<_> = held
            .iter()
            .map(|(key, status)| as_json(key.as_str(), Some(status)))
            .collect();
        println!("{}", json!({ "keys": keys, "truncated": truncated }));
    } else {
        for (key, status) in &held {
            println!("{}", as_line(key.as_str(), Some(status)));
        }
        if held.is_empty() && prefix.is_empty() {
            eprintln!("distlock: no key is held");
        } else if held.is_empty() {
            eprintln!("distlock: no held key starts with {prefix:?}");
        }
    }
    if truncated {
        eprintln!(
            "distlock: only the first {limit} held keys are shown; more are held (raise --limit, or give a longer prefix)"
        );
    }
    Ok(0)
}
