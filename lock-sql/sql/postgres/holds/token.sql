-- The next fencing token from the sequence the lock table uses, drawn only for a grant.
SELECT nextval('{table}_tokens')
