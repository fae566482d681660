-- set: write the value unconditionally and delete any lease, which fences
-- out a fill in flight.
--
-- KEYS: value, lock, channel. ARGV: bytes, ttl ms. Returns 1.
-- The publish command is filled in when the script is loaded: PUBLISH, or
-- SPUBLISH (sharded) on a cluster.
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('DEL', KEYS[2])
redis.call('__PUBLISH__', KEYS[3], 'set')
return 1
