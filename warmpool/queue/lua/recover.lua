-- ARGV: error text, max_failures, then (key, rid, body, dead_rid, dead_body) ->
--   "recovered" | "dead" | "skip", per key. A holder that died mid-run counts as a failure
-- (so a key that kills its workers ends up dead-lettered) but reruns at once, no backoff,
-- untriggered: what the dead run wrote is unknown.
local err, max = ARGV[1], ARGV[2]
local out = {}
for i = 3, #ARGV, 5 do
  local key, rid, body = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local deadline = redis.call("ZSCORE", INFLIGHT, key)
  if deadline and tonumber(deadline) <= NOW and not leased(key) then
    redis.call("ZREM", INFLIGHT, key)
    local _, dead = fail(key, err, max, ARGV[i + 3], ARGV[i + 4])
    if not dead then
      untriggered(key)
      mark_dirty(key)
    end
    if is_dirty(key) and not has_message(key) then enqueue(key, rid, body) end
    if dead then out[#out + 1] = "dead" else out[#out + 1] = "recovered" end
  else
    out[#out + 1] = "skip"
  end
end
return out
