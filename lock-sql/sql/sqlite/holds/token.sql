-- The next fencing token from the counter the lock table uses, drawn only for a grant.
UPDATE {table}_tokens SET last_token = last_token + 1 WHERE id = 1 RETURNING last_token
