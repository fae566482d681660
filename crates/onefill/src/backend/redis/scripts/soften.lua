-- soften (prepended to the scripts that expire a value): makes the value at
-- `key` stale without deleting it (decision 0011's stamp kept true).
--
-- `soften(key)`: a readable envelope whose grace is above zero and whose
-- PTTL exceeds that grace now expires at the server's clock (`TIME`) plus
-- the grace, so it reads as stale at once and lives out its grace window;
-- the recorded expiry of a version-2, 4 or 6 envelope (bytes 17..24,
-- right after the header in each) is rewritten to that same instant,
-- since a reader's plain `GET` trusts it. A value stale
-- already keeps its expiry (its stamp is set to it). A value without
-- grace, or bytes that are not an envelope, are deleted. Returns 1 if the
-- value was shortened, 2 if it was deleted, 0 if its expiry stayed (no
-- value, or stale already).
local function soften(key)
  local v = redis.call('GET', key)
  if not v then
    return 0
  end
  local version = string.byte(v, 2)
  if #v < 16 or string.byte(v, 1) ~= 241 or string.byte(v, 3) > 2
      or not (version == 1 or version == 3
        or ((version == 2 or version == 4) and #v >= 24)
        or (version == 6 and #v >= 32)) then
    redis.call('DEL', key)
    return 2
  end
  local grace = 0
  for i = 5, 12 do
    grace = grace * 256 + string.byte(v, i)
  end
  if grace == 0 then
    redis.call('DEL', key)
    return 2
  end
  local left = redis.call('PTTL', key)
  local at
  local changed = 1
  if left >= 0 and left <= grace then
    -- Stale already: its expiry stays. Its stamp is made to tell that
    -- expiry all the same: another client's PEXPIRE may have cut the key's
    -- TTL under a stamp that still says fresh.
    at = redis.call('PEXPIRETIME', key)
    changed = 0
  else
    local t = redis.call('TIME')
    at = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + grace
    redis.call('PEXPIREAT', key, at)
  end
  if version == 2 or version == 4 or version == 6 then
    local e = {}
    local x = at
    for i = 8, 1, -1 do
      e[i] = x % 256
      x = math.floor(x / 256)
    end
    redis.call('SETRANGE', key, 16,
      string.char(e[1], e[2], e[3], e[4], e[5], e[6], e[7], e[8]))
  end
  return changed
end
