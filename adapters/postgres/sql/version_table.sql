CREATE TABLE IF NOT EXISTS {{version_table}} (
	version integer PRIMARY KEY,
	name text NOT NULL,
	fence_table text NOT NULL,
	applied_at timestamptz NOT NULL DEFAULT now()
)
