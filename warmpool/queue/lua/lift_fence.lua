-- ARGV: seen (decimal text) -> the counter after (decimal text): max(counter, seen), seen
-- capped at FENCE_CEILING. A job found an object written under a fence above ours: either we
-- are a stale holder (the counter is already past `seen`: nothing changes) or Redis lost the
-- counter and restarted it low. Raising it to `seen` makes the next acquisition's INCR issue
-- seen + 1, so the next holder's writes stand above everything the objects carry. Never
-- lowers it: fences only grow. Compared as decimal strings, never as Lua numbers (doubles:
-- 10^14 would be written back as "1e+14", which nothing can INCR or parse). The cap keeps
-- the counter more than 8 * 10^18 INCRs below int64's end, whatever an annotation says.
local seen = canonical(ARGV[1])
if not seen then return redis.error_reply(string.format("lift_fence: not a fence: %s", shown(ARGV[1]))) end
if not rv_ge(FENCE_CEILING, seen) then seen = FENCE_CEILING end
local current = fence_counter()
if current == nil or not rv_ge(current, seen) then
  redis.call("SET", FENCE, seen)
  return seen
end
return current
