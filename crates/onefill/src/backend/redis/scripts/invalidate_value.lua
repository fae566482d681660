-- invalidate_value: `invalidate`'s step on the value alone, for a cluster
-- slot that migrates (write.rs), with its optional age.
--
-- KEYS: value. ARGV (optional): an age in ms (see invalidate.lua).
-- Returns 1 if the value was deleted (or there was none), 0 if it was kept.
if ARGV[1] and ARGV[1] ~= '' and written_since(KEYS[1], ARGV[1]) then
  return 0
end
redis.call('DEL', KEYS[1])
return 1
