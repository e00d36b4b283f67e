-- fence_admit(resource, token) admits token for resource in the caller's
-- transaction, exactly as the Go adapter does: the first statement of the
-- transaction, it locks the resource's fence row until the transaction ends,
-- so that a read-modify-write after it is serialised per resource.
--
-- It returns the new highest token (the token itself). A stale token raises
-- SQLSTATE SF001 (class SF, "stale fence", is not used by the SQL standard or
-- by PostgreSQL) with the message
--   fence: stale token <token> for "<resource>": highest admitted is <highest>
-- and the detail "token=<token> highest=<highest> resource=<resource>", which
-- the Go adapter parses; the resource comes last so that it may contain
-- anything. A NULL or non-positive token raises 22023.
CREATE OR REPLACE FUNCTION {{schema}}.fence_admit(resource text, token bigint)
RETURNS bigint
LANGUAGE plpgsql
VOLATILE
AS $fence_admit$
#variable_conflict use_column
DECLARE
	highest bigint;
BEGIN
	IF fence_admit.token IS NULL OR fence_admit.token < 1 THEN
		RAISE EXCEPTION 'fence: invalid token %: want 1 to 9223372036854775807',
			coalesce(fence_admit.token::text, 'NULL')
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	IF fence_admit.resource IS NULL THEN
		RAISE EXCEPTION 'fence: resource is NULL' USING ERRCODE = 'null_value_not_allowed';
	END IF;

	-- Only advance the token; the row is locked whether it was inserted or
	-- updated. Tokens are admitted with >=: one holder may write many times.
	INSERT INTO {{fence_table}} AS f (resource, token)
	VALUES (fence_admit.resource, fence_admit.token)
	ON CONFLICT (resource) DO UPDATE SET token = EXCLUDED.token
	WHERE f.token <= EXCLUDED.token
	RETURNING f.token INTO highest;
	IF FOUND THEN
		RETURN highest;
	END IF;

	-- No row affected: a higher token is there. Under READ COMMITTED this
	-- statement sees the latest committed row, under REPEATABLE READ and
	-- SERIALIZABLE the transaction's snapshot, which the upsert also used.
	SELECT f.token INTO highest FROM {{fence_table}} AS f WHERE f.resource = fence_admit.resource;
	IF highest IS NULL OR highest <= fence_admit.token THEN
		-- The row was deleted or lowered between the two statements: a
		-- concurrent change, so ask the caller to retry the transaction.
		RAISE EXCEPTION 'fence: fence row for "%" changed during admit', fence_admit.resource
			USING ERRCODE = 'serialization_failure';
	END IF;
	RAISE EXCEPTION 'fence: stale token % for "%": highest admitted is %',
		fence_admit.token, fence_admit.resource, highest
		USING ERRCODE = 'SF001',
			DETAIL = format('token=%s highest=%s resource=%s', fence_admit.token, highest, fence_admit.resource),
			HINT = 'A holder with a higher token has written; this holder has lost its lock and must not write.';
END
$fence_admit$;
