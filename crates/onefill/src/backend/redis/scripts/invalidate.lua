-- invalidate: delete the value and any lease, which fences out a fill in
-- flight.
--
-- KEYS: value, lock, channel. ARGV (optional): an age in ms, for the
-- replay of a write that may not have run (replay.rs): a value written
-- within that age (`written_since`, written.lua: after the write being
-- replayed was sent) is newer than that write and is kept; the lease is
-- deleted all the same. Returns 1 if the value was deleted (or there was
-- none), 0 if it was kept.
-- `announce` (prepended when the script is loaded, scripts.rs) publishes
-- the change for waiters and L1s; `__PUBLISH__` (PUBLISH, or SPUBLISH on a
-- cluster) tells waiters only.
if ARGV[1] and ARGV[1] ~= '' and written_since(KEYS[1], ARGV[1]) then
  redis.call('DEL', KEYS[2])
  announce(KEYS[3], 'invalidate')
  return 0
end
redis.call('DEL', KEYS[1], KEYS[2])
announce(KEYS[3], 'invalidate')
return 1
