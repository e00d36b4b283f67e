ALTER TABLE {{table}} ADD COLUMN IF NOT EXISTS {{fence_column}} bigint NOT NULL DEFAULT 0
