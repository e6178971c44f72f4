-- ARGV: key, lease key it waits for (a work key), fallback_ms, n, n x (field, value)
--   -> "parked" | "delayed" | "deduplicated"
-- A run that found the lease of `on` busy (a claim whose instance is being reconciled) waits
-- for its release instead of polling: the key joins `wait:<on>`, and `done` of that lease makes
-- every waiter due at once. If the lease is already free (released between the run's try and
-- this call), the key is due now. Either way the key is also delayed by at most `fallback_ms`,
-- its own timer: a holder that dies releases nothing, and its lease only expires. As for
-- `add_after`, the triggers are recorded, and a dirty key (added meanwhile) stays as it is,
-- owing a run whatever the versions.
local key, on, fallback = ARGV[1], ARGV[2], tonumber(ARGV[3])
record(key, 4)
if is_dirty(key) then
  untriggered(key)
  return "deduplicated"
end
if not leased(on) then
  redis.call("ZADD", DELAYED, "LT", NOW, key)
  ring_delayed(NOW)
  return "delayed"
end
local waiters = waiters_of(on)
redis.call("SADD", waiters, key)
-- The set lives as long as the longest fallback parked in it: past that, every member has
-- run on its own timer.
if redis.call("PTTL", waiters) < fallback then redis.call("PEXPIRE", waiters, fallback) end
redis.call("ZADD", DELAYED, "LT", NOW + fallback, key)
ring_delayed(NOW + fallback)  -- the promoters' sleep ends by the fallback at the latest
return "parked"
