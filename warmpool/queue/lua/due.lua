-- ARGV: which ("delayed" | "inflight"), limit -> keys that are due.
-- inflight: deadline passed and the lease is really gone (holder died or stalled).
local which, limit = ARGV[1], tonumber(ARGV[2])
if which == "delayed" then
  return redis.call("ZRANGEBYSCORE", DELAYED, "-inf", NOW, "LIMIT", 0, limit)
end
local out = {}
for _, key in ipairs(redis.call("ZRANGEBYSCORE", INFLIGHT, "-inf", NOW, "LIMIT", 0, limit)) do
  if not leased(key) then out[#out + 1] = key end
end
return out
