-- Whether schema $1 has the table $2 that records the migrations. Read from
-- the catalog, which needs no privilege: when it exists and every migration
-- is recorded, Migrate creates nothing, so a role without CREATE on the
-- schema may run it.
SELECT EXISTS (
	SELECT 1 FROM pg_catalog.pg_class c
	JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
	WHERE n.nspname = $1 AND c.relname = $2)
