-- ARGV: key, token, ttl_ms -> {"busy", holder} | {"acquired", value, fence, repairs}
-- (fence as its exact decimal text; repairs: "" or what unreadable Redis content was repaired).
-- A secondary lease: the key's dirty state is left alone, so work waiting for it still runs
-- (its release re-enqueues it). Taking a key whose last holder was lost and not yet recovered
-- (`owes_lost_run`) marks it dirty and untriggered, as the recovery would have: the release
-- then queues the run the lost holder never finished (and if this taker is lost too, the
-- recovery finds the key dirty with no message and queues it), so the debt cannot vanish
-- with the deadline this acquisition replaces.
local key, token, ttl = ARGV[1], ARGV[2], ARGV[3]
local holder, lease_problem = take_lease_of(key)
if holder then return {"busy", holder} end
local owed = owes_lost_run(key)
local value, fence, fence_problem = acquire(key, token, ttl)
if owed then
  untriggered(key)
  mark_dirty(key)
end
return {"acquired", value, fence, notes(lease_problem, fence_problem)}
