-- expire: make the value stale in place (`soften`, soften.lua), delete any
-- lease, which fences out a fill in flight, and announce it.
--
-- KEYS: value, lock, channel. Returns 1.
-- The publish command is filled in when the script is loaded: PUBLISH, or
-- SPUBLISH (sharded) on a cluster.
soften(KEYS[1])
redis.call('DEL', KEYS[2])
redis.call('__PUBLISH__', KEYS[3], 'expire')
return 1
