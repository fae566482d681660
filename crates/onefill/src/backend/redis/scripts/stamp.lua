-- stamp (prepended to every script that writes a value): the envelope as
-- stored, and the expiry to write it with (decision 0011).
--
-- `stamp(bytes, ttl_ms)` returns `bytes, at`: `at` is the server's clock
-- (`TIME`) plus the TTL, in unix milliseconds, for `SET ... PXAT at`, so
-- that the key expires exactly then; a version-1 (or version-2) envelope
-- becomes version 2 with `at` in bytes 17..24, so a reader's plain `GET`
-- tells the expiry; a version 3 (or 4: version 1 or 2 with the marks
-- block, which follows the header) becomes version 4 the same way. Bytes
-- that are not an envelope are stored unchanged.
-- (Redis 7 replicates a script's effects, so `TIME` is allowed here.)
local function stamp(bytes, ttl_ms)
  local t = redis.call('TIME')
  local at = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ttl_ms)
  local version = string.byte(bytes, 2)
  if #bytes < 16 or string.byte(bytes, 1) ~= 241 or string.byte(bytes, 3) > 2
      or not (version == 1 or version == 3
        or ((version == 2 or version == 4) and #bytes >= 24)) then
    return bytes, at
  end
  -- Odd versions lack the expiry; the stamped one is the next even.
  local body = 17
  local stamped = version + 1
  if version == 2 or version == 4 then
    body = 25
    stamped = version
  end
  local e = {}
  local x = at
  for i = 8, 1, -1 do
    e[i] = x % 256
    x = math.floor(x / 256)
  end
  return string.sub(bytes, 1, 1) .. string.char(stamped) .. string.sub(bytes, 3, 16)
      .. string.char(e[1], e[2], e[3], e[4], e[5], e[6], e[7], e[8])
      .. string.sub(bytes, body), at
end
