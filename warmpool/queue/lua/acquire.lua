-- ARGV: key, token, ttl_ms -> {"busy", holder} | {"acquired", value, fence}.
-- A secondary lease: the key's dirty state is left alone, so work waiting for it still runs
-- (its release re-enqueues it).
local key, token, ttl = ARGV[1], ARGV[2], ARGV[3]
local holder = redis.call("GET", LEASE .. key)
if holder then return {"busy", holder} end
local value, fence = acquire(key, token, ttl)
return {"acquired", value, fence}
