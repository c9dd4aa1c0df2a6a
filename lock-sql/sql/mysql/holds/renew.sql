UPDATE {table}_holds SET expires_at = GREATEST(expires_at, {clock} + ?)
WHERE hold_key = ? AND primitive = ? AND lease_id = ? AND kind <> 'intent'
  AND expires_at > {now}
