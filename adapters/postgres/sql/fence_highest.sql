SELECT token FROM {{fence_table}} WHERE resource = $1
