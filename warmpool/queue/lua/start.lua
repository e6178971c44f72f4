-- ARGV: key, token, ttl_ms, acks key, delivered rid -> {"busy", holder} | "stale" | "own" |
--   {"stale" or "own", repairs} (a skip that repaired something on the way) |
--   {"started", lease value, queued ms or -1, failures so far, repairs, trigger field, value,
--   ...}; repairs: "" or what was found unreadable in Redis and repaired on the way (a lease
--   value or counter someone else wrote: see lib.lua), for the caller to log.
-- (the fence is the lease value's head; replies are flat, as few elements as will do: each
-- one is parsed in Python on every job)
-- A skipped delivery (busy, stale, own) is acked here; a busy one also stops counting as the
-- key's queued message, so the holder's `done` queues a fresh one. The triggers (a flat
-- field/value list) are handed over and deleted with the lease taken: adds from now on are
-- the next run's. "own": every trigger is a version this key's own runs wrote, so the run
-- would only read back its own writes: the key is done waiting without running.
local key, token, ttl, acks, rid = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local holder, lease_problem = take_lease_of(key)
if holder then
  if rid ~= "" and redis.call("HGET", PENDING, key) == rid then redis.call("HDEL", PENDING, key) end
  ack(key, acks, rid)
  return {"busy", holder}
end
if not is_dirty(key) then
  ack(key, acks, rid)
  if lease_problem then return {"stale", lease_problem} end
  return "stale"
end
-- The key's last holder was lost and the recovery pass has not reached it: this run is the
-- rerun it owed, so it must run (never skipped as "own") and reconcile fully, since what the
-- lost run wrote is unknown -- the `*` the recovery would have recorded. The deadline this
-- start replaces then stands for this run alone.
if owes_lost_run(key) then untriggered(key) end
redis.call("SREM", DIRTY, key)
redis.call("HDEL", PENDING, key)
local added = redis.call("HGET", ADDED_AT, key)
redis.call("HDEL", ADDED_AT, key)
local trig = redis.call("HGETALL", TRIG .. key)
if #trig > 0 then
  redis.call("DEL", TRIG .. key)
  if own_covers(key, trig) then
    ack(key, acks, rid)
    if lease_problem then return {"own", lease_problem} end
    return "own"
  end
end
local value, _, fence_problem = acquire(key, token, ttl)
local queued = -1
-- A time of ours is 13 digits of ms; anything else someone wrote reads as "not known".
if added and string.match(added, "^%d+$") and #added <= 15 then
  queued = math.max(0, NOW - tonumber(added))
end
local failures, count_problem = failures_of(key)
local out = {"started", value, queued, failures, notes(lease_problem, fence_problem, count_problem)}
for i = 1, #trig do out[i + 5] = trig[i] end
return out
