-- ARGV: ttl_ms, then keys whose lease key was seen with no expiry -> per key "expiring" |
-- "deleted" | "ok". Every lease of ours is written with PX and renewed with PEXPIRE, so one
-- without an expiry was written by someone else (or made to persist): left alone it blocks
-- its key for good, since nothing ever recovers a key whose lease exists. Rechecked here
-- (the holder may have released or renewed it since the scan): a sound lease of a run in
-- flight gets the lease TTL (its holder, if alive, keeps renewing it; if not, it lapses and
-- the recovery reruns the key); anything else is deleted, and the audit then gives a waiting
-- key its message back.
local ttl = tonumber(ARGV[1])
local out = {}
for i = 2, #ARGV do
  local key = ARGV[i]
  if redis.call("PTTL", LEASE .. key) ~= -1 then
    out[#out + 1] = "ok"
  elseif lease_value(key) and redis.call("ZSCORE", INFLIGHT, key) then
    redis.call("PEXPIRE", LEASE .. key, ttl)
    out[#out + 1] = "expiring"
  else
    redis.call("DEL", LEASE .. key)
    out[#out + 1] = "deleted"
  end
end
return out
