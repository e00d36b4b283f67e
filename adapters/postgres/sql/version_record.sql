INSERT INTO {{version_table}} (version, name, fence_table) VALUES ($1, $2, $3)
