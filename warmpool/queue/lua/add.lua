-- ARGV: per key: key, rid, body, n, n x (trigger field, value) -> one result per key.
-- The triggers are recorded whatever the result: a deduplicated add still names versions the
-- coming run must see, and a rerun add those the run after the current one must.
local out = {}
local i = 1
while i <= #ARGV do
  local key, rid, body = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  i = record(key, i + 3)
  out[#out + 1] = add(key, rid, body)
end
return out
