UPDATE {table}_holds SET expires_at = {clock} + $1
WHERE hold_key = $2 AND primitive = $3 AND lease_id = $4 AND kind <> 'intent'
  AND expires_at > {now}
