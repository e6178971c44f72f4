-- ARGV: (key, rid, body) -> "repaired" | "ok". A repaired key runs untriggered: whatever
-- lost its message may have lost its triggers too.
local out = {}
for i = 1, #ARGV, 3 do
  local key = ARGV[i]
  if orphaned(key) then
    untriggered(key)
    enqueue(key, ARGV[i + 1], ARGV[i + 2])
    out[#out + 1] = "repaired"
  else
    out[#out + 1] = "ok"
  end
end
return out
