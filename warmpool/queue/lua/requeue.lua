-- ARGV: (key, rid, body) -> "enqueued" | "ok", per key: the message a `done` said was needed,
-- if it still is (the key may have been taken, run or repaired meanwhile).
local out = {}
for i = 1, #ARGV, 3 do
  local key = ARGV[i]
  if orphaned(key) then
    enqueue(key, ARGV[i + 1], ARGV[i + 2])
    out[#out + 1] = "enqueued"
  else
    out[#out + 1] = "ok"
  end
end
return out
