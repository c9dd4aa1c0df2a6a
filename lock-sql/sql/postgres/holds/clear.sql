-- The key's expired holds and intents go, so every row rows.sql then reads is live. The
-- delete locks each row it removes and re-checks a row a renewal changed meanwhile, so a
-- renewal either lands first (and the row stays) or finds the row gone.
DELETE FROM {table}_holds WHERE hold_key = $1 AND primitive = $2 AND expires_at <= {now}
