SELECT version, fence_table FROM {{version_table}} ORDER BY version
