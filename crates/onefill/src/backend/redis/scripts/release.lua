-- release: compare-and-delete the lease, optionally writing a short entry
-- (a cached failure).
--
-- KEYS: value, lock, channel. ARGV: token[, bytes, ttl ms, the load's
-- age in ms (see stamp.lua; empty if unknown)].
-- Returns 1 if the lease was ours, else 0 (nothing changed).
-- `announce` (prepended when the script is loaded, scripts.rs) publishes
-- the change for waiters and L1s; `__PUBLISH__` (PUBLISH, or SPUBLISH on a
-- cluster) tells waiters only. The value is stored as an envelope of
-- version 6 (or 2), stamped with the server's expiry and the write's
-- instant (`stamp`, stamp.lua).
if redis.call('GET', KEYS[2]) == ARGV[1] then
  redis.call('DEL', KEYS[2])
  if #ARGV >= 3 then
    local bytes, at = stamp(ARGV[2], ARGV[3], ARGV[4])
    redis.call('SET', KEYS[1], bytes, 'PXAT', at)
    announce(KEYS[3], 'release')
  else
    redis.call('__PUBLISH__', KEYS[3], 'release')
  end
  return 1
end
return 0
