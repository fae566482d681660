-- mark: the namespace's generation moves past the server's clock, and a
-- tag's (or the whole namespace's) mark records it (decision 0018).
--
-- KEYS: the generation, the mark (one slot).
-- ARGV: 'hard' or 'soft'; how long to keep the mark at least, in ms ('':
-- for ever).
-- Returns the new generation, and announces the change (see the end).
--
-- The generation is the larger of itself plus one and the server's clock
-- in microseconds (about 1.8e15: exact in a Lua number), so it never goes
-- back, even if the key is lost (a flush, a failover that lost the write):
-- a value loaded before a mark must never be read as newer than it. The
-- mark is `"<hard> <soft>"`, the generations of the last invalidation and
-- of the last invalidation or expiry; anything else under its key reads as
-- no mark.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
-- A generation this script would not have written (another client's
-- bytes, a number past 2^52 where `g + 1` stops being exact and readers
-- stop believing it) is no generation: the clock takes over.
local g = tonumber(redis.call('GET', KEYS[1]) or '0')
if not g or g ~= g or g < 0 or g > 4503599627370496 or g ~= math.floor(g) then
  g = 0
end
g = math.max(g + 1, now)
redis.call('SET', KEYS[1], string.format('%.0f', g))
local hard = 0
local old = redis.call('GET', KEYS[2])
if old then
  local h = string.match(old, '^(%d+) %d+$')
  if h and tonumber(h) <= 4503599627370496 then
    hard = tonumber(h)
  end
end
if ARGV[1] == 'hard' then
  hard = g
end
local mark = string.format('%.0f %.0f', hard, g)
local keep = redis.call('PTTL', KEYS[2])
if ARGV[2] == '' or keep == -1 then
  redis.call('SET', KEYS[2], mark)
else
  local ttl = tonumber(ARGV[2])
  if keep > ttl then
    ttl = keep
  end
  redis.call('SET', KEYS[2], mark, 'PX', ttl)
end
-- Announced for the L1s that cannot track keys (scripts.rs): on the
-- mark's own channel, which shares the namespace's channel pattern; a
-- plain PUBLISH on a cluster too (no waiter listens to it).
redis.call('PUBLISH', KEYS[2] .. ':filled', 'mark')
return g
