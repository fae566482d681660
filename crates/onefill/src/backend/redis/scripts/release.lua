-- release: compare-and-delete the lease, optionally writing a short entry
-- (a cached failure).
--
-- KEYS: value, lock, channel. ARGV: token[, bytes, ttl ms].
-- Returns 1 if the lease was ours, else 0 (nothing changed).
-- The publish command is filled in when the script is loaded: PUBLISH, or
-- SPUBLISH (sharded) on a cluster.
if redis.call('GET', KEYS[2]) == ARGV[1] then
  redis.call('DEL', KEYS[2])
  if #ARGV >= 3 then
    redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  end
  redis.call('__PUBLISH__', KEYS[3], 'release')
  return 1
end
return 0
