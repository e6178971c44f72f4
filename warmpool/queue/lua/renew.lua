-- ARGV: ttl_ms, then (key, value) pairs -> 1 renewed / 0 lost, per pair.
local ttl = tonumber(ARGV[1])
local out = {}
for i = 2, #ARGV, 2 do
  local key, value = ARGV[i], ARGV[i + 1]
  if lease_value(key) == value then  -- another type there fails no one's renewal
    redis.call("PEXPIRE", LEASE .. key, ttl)
    redis.call("ZADD", INFLIGHT, "XX", NOW + ttl, key)
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out
