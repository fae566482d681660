-- expire: make the value stale in place (`soften`, soften.lua), delete any
-- lease, which fences out a fill in flight, and announce it.
--
-- KEYS: value, lock, channel. Returns 1.
-- `announce` (prepended when the script is loaded, scripts.rs) publishes
-- the change for waiters and L1s; `__PUBLISH__` (PUBLISH, or SPUBLISH on a
-- cluster) tells waiters only.
soften(KEYS[1])
redis.call('DEL', KEYS[2])
announce(KEYS[3], 'expire')
return 1
