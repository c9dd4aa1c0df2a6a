SELECT pg_notify('{channel}', $1)::text
