-- A record past its retention is never returned (and is overwritten or swept later).
SELECT value, fingerprint, token FROM {table}_records
WHERE record_key = ? AND expires_at > {now}
