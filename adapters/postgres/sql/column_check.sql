-- What makes the column $3 of table $2 in schema $1 unusable as the fence
-- column, or '' when it is bigint NOT NULL. AddColumn runs it after ADD
-- COLUMN IF NOT EXISTS, which keeps a column of that name whatever its type;
-- a NULL token would admit nothing, as NULL <= $2 is never true.
SELECT concat_ws('; ',
	CASE WHEN a.atttypid <> 'int8'::regtype
		THEN format('it is %s, not bigint', format_type(a.atttypid, a.atttypmod)) END,
	CASE WHEN NOT a.attnotnull THEN 'it may be NULL' END)
FROM pg_catalog.pg_attribute a
WHERE a.attrelid = to_regclass(format('%I.%I', $1::text, $2::text))
	AND a.attname = $3 AND NOT a.attisdropped
