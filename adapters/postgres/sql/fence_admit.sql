-- Admit $2 for resource $1: insert the row or advance its token, never lower
-- it. Either way the row stays locked until the transaction ends. No row
-- returned means a higher token is there.
INSERT INTO {{fence_table}} AS f (resource, token)
VALUES ($1, $2)
ON CONFLICT (resource) DO UPDATE SET token = EXCLUDED.token
WHERE f.token <= EXCLUDED.token
RETURNING f.token
