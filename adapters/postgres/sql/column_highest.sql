SELECT {{fence_column}} FROM {{table}} WHERE {{key_column}} = $1
