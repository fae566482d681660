-- stamp (prepended to every script that writes a value): the envelope as
-- stored, and the expiry to write it with (decisions 0011 and 0024).
--
-- `stamp(bytes, ttl_ms, age_ms)` returns `bytes, at`: `at` is the server's clock
-- (`TIME`) plus the TTL, in unix milliseconds, for `SET ... PXAT at`, so
-- that the key expires exactly then; a version-1 (or version-2) envelope
-- becomes version 2 with `at` in bytes 17..24, so a reader's plain `GET`
-- tells the expiry; a version 3 (or 4 or 6: version 1 or 2 with the marks
-- block, which follows the header) becomes version 6: `at`, then the
-- instant the value is as of (bytes 25..32): the server's clock of now
-- less `age_ms`, how long ago the load that made it began (a fill's:
-- its data may be that old; `0` for a `set`; empty: not known, stamped as
-- of the epoch), then the marks block. Bytes that are not an envelope are
-- stored unchanged.
-- (Redis 7 replicates a script's effects, so `TIME` is allowed here.)
local function be8(x)
  local e = {}
  for i = 8, 1, -1 do
    e[i] = x % 256
    x = math.floor(x / 256)
  end
  return string.char(e[1], e[2], e[3], e[4], e[5], e[6], e[7], e[8])
end

local function stamp(bytes, ttl_ms, age_ms)
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local at = now + tonumber(ttl_ms)
  local as_of = 0
  local age = tonumber(age_ms or '')
  if age then
    as_of = math.max(now - age, 0)
  end
  local version = string.byte(bytes, 2)
  if #bytes < 16 or string.byte(bytes, 1) ~= 241 or string.byte(bytes, 3) > 2
      or not (version == 1 or version == 3
        or ((version == 2 or version == 4) and #bytes >= 24)
        or (version == 6 and #bytes >= 32)) then
    return bytes, at
  end
  -- Where the body (the marks block or the payload) starts, 1-based.
  local body = 17
  if version == 2 or version == 4 then
    body = 25
  elseif version == 6 then
    body = 33
  end
  local head = string.sub(bytes, 1, 1)
  local rest = string.sub(bytes, 3, 16)
  if version == 1 or version == 2 then
    return head .. string.char(2) .. rest .. be8(at) .. string.sub(bytes, body), at
  end
  return head .. string.char(6) .. rest .. be8(at) .. be8(as_of) .. string.sub(bytes, body), at
end
