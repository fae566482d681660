-- extend: compare-and-PEXPIRE the lease (the watchdog).
--
-- KEYS: value (unused), lock, channel. ARGV: token, ttl ms.
-- Returns 1 if the lease was ours, else 0, and then announces the loss:
-- waiters who watch this holder alive learn that its lease is gone.
-- The publish command is filled in when the script is loaded.
if redis.call('GET', KEYS[2]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
  return 1
end
redis.call('__PUBLISH__', KEYS[3], 'lost')
return 0
