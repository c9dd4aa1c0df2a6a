//! `distlock status`: who holds keys, never with the holder's lease id.

use distlock::LockStatus;
use serde_json::json;

use crate::cli::StatusArgs;
use crate::duration::format_duration;
use crate::failure::{Failure, NOT_ACQUIRED};
use crate::store;

/// Looks the keys up and prints them; 0 when every key is held, 1 when one is free.
pub async fn status(args: StatusArgs, store_url: &str) -> Result<u8, Failure> {
    let client = store::connect(store_url).await?;
    let mut found = Vec::with_capacity(args.keys.len());
    for key in &args.keys {
        let status = client
            .inspect(key)
            .await
            .map_err(|err| Failure::from_store_error(&err, store_url))?;
        found.push((key.as_str(), status));
    }
    if args.json {
        let objects: Vec<_> = found
            .iter()
            .map(|(key, status)| as_json(key, status.as_ref()))
            .collect();
        println!("{}", serde_json::Value::Array(objects));
    } else {
        for (key, status) in &found {
            println!("{}", as_line(key, status.as_ref()));
        }
    }
    let all_held = found.iter().all(|(_, status)| status.is_some());
    Ok(if all_held { 0 } else { NOT_ACQUIRED })
}

/// `KEY: held, token N, expires in 27.1s, 2 waiting, holder "..."` or `KEY: free`.
pub fn as_line(key: &str, status: Option<&LockStatus>) -> String {
    let Some(status) = status else {
        return format!("{key}: free");
    };
    let mut line = format!(
        "{key}: held, token {}, expires in {}",
        status.token,
        format_duration(status.remaining_ttl)
    );
    if let Some(waiters) = status.waiters {
        line.push_str(&format!(", {waiters} waiting"));
    }
    if let Some(holder) = &status.holder {
        line.push_str(&format!(", holder {holder:?}"));
    }
    line
}

/// One key's object; `waiters` and `holder` are null where the store does not know them.
pub fn as_json(key: &str, status: Option<&LockStatus>) -> serde_json::Value {
    match status {
        None => json!({ "key": key, "held": false }),
        Some(status) => json!({
            "key": key,
            "held": true,
            "token": status.token.get(),
            "remaining_ttl_ms": u64::try_from(status.remaining_ttl.as_millis()).unwrap_or(u64::MAX),
            "waiters": status.waiters,
            "holder": status.holder,
        }),
    }
}
