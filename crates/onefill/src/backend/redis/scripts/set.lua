-- set: write the value unconditionally and delete any lease, which fences
-- out a fill in flight.
--
-- KEYS: value, lock, channel. ARGV: bytes, ttl ms. Returns 1.
-- `announce` (prepended when the script is loaded, scripts.rs) publishes
-- the change for waiters and L1s; `__PUBLISH__` (PUBLISH, or SPUBLISH on a
-- cluster) tells waiters only. The value is stored as an envelope of
-- version 6 (or 2), stamped with the server's expiry and the write's
-- instant (`stamp`, stamp.lua).
local bytes, at = stamp(ARGV[1], ARGV[2], '0')
redis.call('SET', KEYS[1], bytes, 'PXAT', at)
redis.call('DEL', KEYS[2])
announce(KEYS[3], 'set')
return 1
