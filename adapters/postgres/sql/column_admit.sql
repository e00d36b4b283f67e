-- Admit $2 for the row whose key is $1 and lock the row until the
-- transaction ends. No row returned means the row is missing or carries a
-- higher token.
UPDATE {{table}} SET {{fence_column}} = $2
WHERE {{key_column}} = $1 AND {{fence_column}} <= $2
RETURNING {{fence_column}}
