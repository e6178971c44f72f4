-- ARGV: key, value, mode (ok|fail|release), acks key, acked rid, g, g x own-write groups
--   (target key, n, n x (field, value))
--   [, error, base_ms, cap_ms, max_failures, dead_rid, dead_body  -- mode "fail" only]
--   -> {outcome, rerun 0/1, retry delay ms or -1, failures, message needed 0/1}, or just
--   the outcome when the rest is {0, -1, 0, 0} (the common case: one element to parse)
-- With an acks key, the delivered message is acked here exactly as dispatch.lua's "ack" does
-- it, which saves the worker a round trip per job. A run (ok, fail) replaces the key's own
-- writes record; every group is merged into its target's (a secondary lease's key: written
-- under that lease). No body comes in: when the key was re-added and has no message on its
-- way, "message needed" says so, and the caller builds one and calls `requeue` -- on reruns
-- only. Keys parked on this lease (`park.lua`) are made due at once.
local key, value, mode = ARGV[1], ARGV[2], ARGV[3]
ack(key, ARGV[4], ARGV[5])
if lease_value(key) ~= value then return {"lost", 0, -1, 0, 0} end
redis.call("DEL", LEASE .. key)
redis.call("ZREM", INFLIGHT, key)
wake_waiters(key)
if mode ~= "release" then redis.call("DEL", OWN .. key) end
local x = 7
for _ = 1, tonumber(ARGV[6]) do
  local own, n = OWN .. ARGV[x], tonumber(ARGV[x + 1])
  for j = x + 2, x + 1 + 2 * n, 2 do note(own, ARGV[j], ARGV[j + 1]) end
  redis.call("PEXPIRE", own, OWN_TTL)
  x = x + 2 + 2 * n
end
local outcome, delay, failures = "released", -1, 0
if mode == "ok" then
  redis.call("HDEL", FAILURES, key)
  redis.call("HDEL", ERRORS, key)
  clear_dead(key)
  outcome = "success"
elseif mode == "fail" then
  local dead
  failures, dead = fail(key, ARGV[x], ARGV[x + 3], ARGV[x + 4], ARGV[x + 5])
  if dead then
    outcome = "dead"
  else
    outcome = "retry"
    if is_dirty(key) then
      delay = 0
      untriggered(key)  -- the retry is owed whatever the triggers say
    else
      local backoff = tonumber(ARGV[x + 1]) * 2 ^ (failures - 1)
      delay = math.floor(math.min(backoff, tonumber(ARGV[x + 2])))
      redis.call("ZADD", DELAYED, "LT", NOW + delay, key)
      ring_delayed(NOW + delay)  -- a 5 ms retry must not wait for a promoter's fallback
    end
  end
end
local rerun, needed = 0, 0
if is_dirty(key) then
  rerun = 1
  -- A message may still be on its way (delivered while we held the key, not yet skipped):
  -- it will find the key free. Otherwise the caller queues one.
  if not has_message(key) then needed = 1 end
end
if rerun == 0 and delay == -1 and failures == 0 then return outcome end
return {outcome, rerun, delay, failures, needed}
