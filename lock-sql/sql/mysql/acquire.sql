-- Whether the old lease is over is judged at the statement's start ({now}, NOW(3)). The
-- expiry written over an existing row counts from the moment of writing ({clock},
-- SYSDATE(3)), after the waits for the counter and the row; the TTL is the inserted
-- expiry minus {now}, which is constant within the statement. An inserted row's expiry
-- counts from the start (a grant that ran out while its insert waited for the counter is
-- refused by the backend).
-- The result does not depend on whether the assignments see each other's new values
-- (as MariaDB's SIMULTANEOUS_ASSIGNMENT mode makes them in an UPDATE): each reads only
-- columns assigned after it, except expires_at, whose condition and value come out the
-- same with the old or the new lease_id (holder, the lease's label, comes first and
-- reads only columns assigned after it). The token was drawn by the insert trigger, under
-- the counter row's lock, before the key row's lock, so tokens follow grant order.
-- A contended acquire waits at most one second (the shortest InnoDB lock wait time-out)
-- for the key's row or the token counter, which another transaction holds only while it
-- writes them: past that the statement is rolled back (error 1205, nothing written) and
-- the backend answers "held by another" instead of spending the request time-out, or the
-- statement time-out, waiting behind a stalled writer. Every other acquire waits behind
-- the counter while a statement holds it, so a statement stuck on a row would otherwise
-- hold up acquires of every key.
SET STATEMENT innodb_lock_wait_timeout = 1 FOR
INSERT INTO {table} (lock_key, lease_id, token, expires_at, holder)
VALUES (?, ?, 0, {now} + ?, ?)
ON DUPLICATE KEY UPDATE
    holder = IF(expires_at <= {now} OR lease_id = VALUES(lease_id), VALUES(holder), holder),
    token = IF(expires_at <= {now}, VALUES(token), token),
    lease_id = IF(expires_at <= {now} OR lease_id = VALUES(lease_id), VALUES(lease_id), lease_id),
    expires_at = IF(expires_at <= {now} OR lease_id = VALUES(lease_id),
                    GREATEST(IF(lease_id = VALUES(lease_id), expires_at, 0),
                             {clock} + VALUES(expires_at) - {now}),
                    expires_at)
RETURNING lease_id, token, expires_at - {clock} AS remaining_ms
