-- The token turn.sql drew (this transaction holds the counter's row).
SELECT last_token FROM {table}_tokens WHERE id = 1 FOR UPDATE
