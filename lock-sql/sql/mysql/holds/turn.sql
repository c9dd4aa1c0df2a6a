-- First step of a shared acquire: the token counter's row, which every acquire of the
-- mutex also locks (its insert trigger), is locked and advanced, so acquirers take turns
-- and two of them never both count the holders before either writes; token.sql reads
-- the value drawn. A wait past one second fails (1205: nothing is written and the backend
-- answers "held by another"). No parameters: the counter is shared by all keys.
SET STATEMENT innodb_lock_wait_timeout = 1 FOR
UPDATE {table}_tokens SET last_token = last_token + 1 WHERE id = 1
