-- invalidate: delete the value and any lease, which fences out a fill in
-- flight.
--
-- KEYS: value, lock, channel. Returns 1.
-- The publish command is filled in when the script is loaded: PUBLISH, or
-- SPUBLISH (sharded) on a cluster.
redis.call('DEL', KEYS[1], KEYS[2])
redis.call('__PUBLISH__', KEYS[3], 'invalidate')
return 1
