-- expire_value: `expire`'s step on the value alone (`soften`, soften.lua),
-- for a cluster whose slot migrates: a script of one key is never refused
-- with TRYAGAIN, so the value is still made stale atomically while the
-- lock and the announcement go as commands of their own.
--
-- KEYS: value. Returns what `soften` returns.
return soften(KEYS[1])
