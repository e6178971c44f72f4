-- ARGV: seen -> the counter after: max(counter, seen). A job found an object written under a
-- fence above ours: either we are a stale holder (the counter is already past `seen`: nothing
-- changes) or Redis lost the counter and restarted it low. Raising it to `seen` makes the next
-- acquisition's INCR issue seen + 1, so the next holder's writes stand above everything the
-- objects carry. Never lowers it: fences only grow.
local seen = tonumber(ARGV[1])
local current = tonumber(redis.call("GET", FENCE) or "0") or 0
if seen > current then
  redis.call("SET", FENCE, seen)
  return seen
end
return current
