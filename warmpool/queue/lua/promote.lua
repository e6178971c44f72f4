-- ARGV: (key, rid, body) -> add() result for keys whose ready time has come, else "skip".
local out = {}
for i = 1, #ARGV, 3 do
  local key = ARGV[i]
  local ready = redis.call("ZSCORE", DELAYED, key)
  if ready and tonumber(ready) <= NOW then
    untriggered(key)
    out[#out + 1] = add(key, ARGV[i + 1], ARGV[i + 2])
  else
    out[#out + 1] = "skip"
  end
end
return out
