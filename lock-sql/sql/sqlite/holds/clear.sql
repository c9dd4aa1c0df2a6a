-- First step of a shared acquire (after BEGIN IMMEDIATE, which holds the database's write
-- lock, so acquirers take turns): the key's expired holds and intents go, so every row
-- rows.sql then reads is live and a late renewal cannot bring one back.
DELETE FROM {table}_holds WHERE hold_key = ?1 AND primitive = ?2 AND expires_at <= {now}
