-- fill: write the loaded value only while the lease still holds our token.
--
-- KEYS: value, lock, channel. ARGV: token, bytes, ttl ms, the load's age
-- in ms (see stamp.lua; empty if unknown).
-- Returns 1 if the lease was ours (value written, lease deleted, fill
-- announced), else 0 (nothing written, and the loss announced: waiters who
-- watch this holder alive would otherwise wait for a fill that never comes).
-- `announce` (prepended when the script is loaded, scripts.rs) publishes
-- the change for waiters and L1s; `__PUBLISH__` (PUBLISH, or SPUBLISH on a
-- cluster) tells waiters only. The value is stored as an envelope of
-- version 6 (or 2), stamped with the server's expiry and the write's
-- instant (`stamp`, stamp.lua).
if redis.call('GET', KEYS[2]) == ARGV[1] then
  local bytes, at = stamp(ARGV[2], ARGV[3], ARGV[4])
  redis.call('SET', KEYS[1], bytes, 'PXAT', at)
  redis.call('DEL', KEYS[2])
  announce(KEYS[3], 'fill')
  return 1
end
redis.call('__PUBLISH__', KEYS[3], 'lost')
return 0
