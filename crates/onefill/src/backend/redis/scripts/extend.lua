-- extend: compare-and-PEXPIRE the lease (the watchdog).
--
-- KEYS: lock. ARGV: token, ttl ms.
-- Returns 1 if the lease was ours, else 0.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
