package lock

import "strings"

// redisACLCommands are the commands a RedisStore sends: its scripts
// (EVALSHA, EVAL when Redis lost them), the commands those scripts call
// (an ACL applies inside a script too), List's SCAN, the eviction check's
// INFO, the release notifications' SUBSCRIBE, and what go-redis sends on
// a connection: PING, SELECT for a database other than 0, and on a
// Cluster CLUSTER SLOTS and COMMAND (go-redis routes by its answer, and
// asked again before every call while it was refused).
var redisACLCommands = []string{
	"evalsha", "eval", "scan", "info", "ping", "select", "subscribe", "unsubscribe", "cluster|slots", "command",
	"get", "set", "del", "exists", "pexpire", "pexpireat", "pttl", "time", "publish",
	"hget", "hset", "hdel", "hincrby", "hmget", "lpush", "lrange", "ltrim",
	"zadd", "zcount", "zrange", "zrangebyscore", "zrank", "zrem", "zremrangebyscore", "zscore",
}

// RedisACLRules returns the least rules of a Redis ACL user for a
// RedisStore whose key prefix is prefix ("fenced:" by default): its keys
// and its channels, all under the prefix, and the commands it sends. For
// example, in redis-cli:
//
//	ACL SETUSER fenced on >PASSWORD resetkeys resetchannels -@all <rules>
//
// The README gives the line for the default prefix.
// Redis answers a command the user may not run with NOPERM, which fenced
// serve reports on /readyz and in its log (docs/design.md, defect 211).
func RedisACLRules(prefix string) string {
	rules := []string{"~" + prefix + "*", "&" + prefix + "*"}
	for _, c := range redisACLCommands {
		rules = append(rules, "+"+c)
	}
	return strings.Join(rules, " ")
}
