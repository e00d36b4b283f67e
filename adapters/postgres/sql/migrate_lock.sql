-- Serialises migrations across processes until the migration transaction ends.
SELECT pg_advisory_xact_lock($1)
