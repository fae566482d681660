-- acquire: return the value if it is fresh, else try to take the lease.
--
-- KEYS: value, lock.
-- ARGV: token, lease ms, refresh window ms, the ms that stand for "no expiry",
-- and, to take over, the token of a holder judged gone (else '').
-- Returns {status, value or nil, value PTTL, lease PTTL, holder's token};
-- status 0 fresh, 1 won, 2 held.
--
-- A lease that still holds the gone holder's token counts as free: of the
-- waiters that judged that holder gone, the first replaces it, and the
-- others find the new token.
--
-- The grace period is read from the envelope header: byte 1 is the magic
-- 0xF1 (241), byte 2 the version (1 or 3; 2, 4 or 6 with the server's
-- expiry in bytes 17..24, 6 with the write's instant in 25..32; 3, 4 and
-- 6 carry the marks block, which only the client reads), byte 3 the kind (0..2), bytes 5..12 the grace in
-- big-endian milliseconds. Bytes that are not such an envelope are never
-- fresh.
if ARGV[5] ~= nil and ARGV[5] ~= '' and redis.call('GET', KEYS[2]) == ARGV[5] then
  redis.call('DEL', KEYS[2])
end
local v = redis.call('GET', KEYS[1])
local vttl = -2
if v then
  vttl = redis.call('PTTL', KEYS[1])
  local version = string.byte(v, 2)
  if #v >= 16 and string.byte(v, 1) == 241 and string.byte(v, 3) <= 2
      and (version == 1 or version == 3
        or ((version == 2 or version == 4) and #v >= 24)
        or (version == 6 and #v >= 32)) then
    local grace = 0
    for i = 5, 12 do
      grace = grace * 256 + string.byte(v, i)
    end
    local left = vttl
    if left == -1 then
      left = tonumber(ARGV[4])
    end
    if left > grace + tonumber(ARGV[3]) then
      return {0, v, vttl, 0, false}
    end
  end
end
-- With NX, GET answers the holder's token, or nil when the lease was free
-- and is ours now (Redis 7.0).
local holder = redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2], 'GET')
if not holder then
  return {1, v, vttl, 0, false}
end
return {2, v, vttl, redis.call('PTTL', KEYS[2]), holder}
