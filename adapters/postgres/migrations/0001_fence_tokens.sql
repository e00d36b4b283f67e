-- The fence table: one row per resource holding the highest token admitted
-- for it. A token is a bigint, so tokens are 1 to 9223372036854775807.
CREATE TABLE IF NOT EXISTS {{fence_table}} (
	resource text PRIMARY KEY,
	token bigint NOT NULL CHECK (token > 0)
);
