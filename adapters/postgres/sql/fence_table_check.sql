-- What makes the table $2 of schema $1 unusable as the fence table, or ''
-- when it is one: a text column "resource" that is a unique key on its own
-- (what the admit's ON CONFLICT needs) and a bigint NOT NULL column "token".
-- Migrate runs it after the migrations, because CREATE TABLE IF NOT EXISTS
-- keeps a table of that name that was there before, whatever its shape.
WITH t AS (SELECT to_regclass(format('%I.%I', $1::text, $2::text)) AS oid)
SELECT CASE WHEN t.oid IS NULL THEN 'it does not exist' ELSE concat_ws('; ',
	CASE WHEN NOT EXISTS (
		SELECT 1 FROM pg_catalog.pg_attribute a
		WHERE a.attrelid = t.oid AND a.attname = 'resource' AND NOT a.attisdropped
			AND a.atttypid = 'text'::regtype)
	THEN 'it has no text column "resource"' END,
	CASE WHEN NOT EXISTS (
		SELECT 1 FROM pg_catalog.pg_attribute a
		WHERE a.attrelid = t.oid AND a.attname = 'token' AND NOT a.attisdropped
			AND a.atttypid = 'int8'::regtype AND a.attnotnull)
	THEN 'it has no bigint NOT NULL column "token"' END,
	CASE WHEN NOT EXISTS (
		SELECT 1 FROM pg_catalog.pg_index i
		JOIN pg_catalog.pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
		WHERE i.indrelid = t.oid AND i.indisunique AND i.indnkeyatts = 1 AND i.indpred IS NULL
			AND a.attname = 'resource')
	THEN '"resource" is not a unique key on its own' END) END
FROM t
