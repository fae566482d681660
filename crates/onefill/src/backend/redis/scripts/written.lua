-- written (prepended to the scripts that invalidate): whether a value was
-- written since a given instant.
--
-- `written_since(key, age_ms)`: true if the value at `key` is a version-6
-- envelope (stamp.lua) as of an instant (bytes 25..32, the server's
-- clock: a `set`'s write, a fill's load's start) later than `age_ms`
-- before the server's clock of now (one in that very millisecond may have
-- come first: not kept). A
-- value of another version, or bytes that are not an envelope, or no
-- value: false (its age cannot be told, or there is nothing to keep).
local function written_since(key, age_ms)
  local v = redis.call('GET', key)
  if not v or #v < 32 or string.byte(v, 1) ~= 241 or string.byte(v, 2) ~= 6 then
    return false
  end
  local written = 0
  for i = 25, 32 do
    written = written * 256 + string.byte(v, i)
  end
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  return written > now - tonumber(age_ms)
end
