-- ARGV: key, token, ttl_ms -> {"busy", holder} | {"acquired", value, fence, repairs}
-- (fence as its exact decimal text; repairs: "" or what unreadable Redis content was repaired).
-- A secondary lease: the key's dirty state is left alone, so work waiting for it still runs
-- (its release re-enqueues it).
local key, token, ttl = ARGV[1], ARGV[2], ARGV[3]
local holder, lease_problem = take_lease_of(key)
if holder then return {"busy", holder} end
local value, fence, fence_problem = acquire(key, token, ttl)
return {"acquired", value, fence, notes(lease_problem, fence_problem)}
