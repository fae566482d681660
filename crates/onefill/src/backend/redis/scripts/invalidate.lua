-- invalidate: delete the value and any lease, which fences out a fill in
-- flight.
--
-- KEYS: value, lock, channel. Returns 1.
-- `announce` (prepended when the script is loaded, scripts.rs) publishes
-- the change for waiters and L1s; `__PUBLISH__` (PUBLISH, or SPUBLISH on a
-- cluster) tells waiters only.
redis.call('DEL', KEYS[1], KEYS[2])
announce(KEYS[3], 'invalidate')
return 1
