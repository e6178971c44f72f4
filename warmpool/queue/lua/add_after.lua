-- ARGV: key, delay_ms, n, n x (field, value). A dirty key already runs as soon as it can:
-- moving it later would break "re-adding only moves the ready time earlier", so that is a
-- no-op (the triggers still count), as is a later time for a key already delayed (ZADD LT).
-- Folded into a waiting run, the delayed run's "run whatever the versions" goes with it, as
-- `mark_dirty` carries it over when an add supersedes a delayed key: without the `*`, a
-- run that wrote (its own write's event re-adding the key while it ran) and then deferred
-- saw that waiting run skipped as "own" (every trigger its own last write), and the
-- deferred key never ran again.
local key = ARGV[1]
record(key, 3)
if is_dirty(key) then
  untriggered(key)
  return "deduplicated"
end
local ready = NOW + tonumber(ARGV[2])
local changed = redis.call("ZADD", DELAYED, "LT", "CH", ready, key)
if changed == 1 then
  ring_delayed(ready)  -- the promoters sleep until the earliest ready time they know of
  return "delayed"
end
return "deduplicated"
