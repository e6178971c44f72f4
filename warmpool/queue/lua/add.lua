-- ARGV: per key: key, rid, body, n, n x (trigger field, value) -> one result per key.
-- The triggers are recorded whatever the result: a deduplicated add still names versions the
-- coming run must see, and a rerun add those the run after the current one must.
-- Except "own": a key at rest (not waiting, running, delayed or owed a lost run) whose every
-- trigger is a version its own last run wrote is not added at all. Its run would only be
-- skipped by `start` for the same reason; refusing it here saves the message, the delivery
-- and the start (a claim's own Session writes re-added its key on every claim: issue #28).
local out = {}
local i = 1
while i <= #ARGV do
  local key, rid, body = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local n = tonumber(ARGV[i + 3])
  local at_rest = n > 0 and not is_dirty(key) and not leased(key)
    and not redis.call("ZSCORE", DELAYED, key) and not owes_lost_run(key)
  if at_rest and own_covers(key, {unpack(ARGV, i + 4, i + 3 + 2 * n)}) then
    i = i + 4 + 2 * n
    out[#out + 1] = "own"
  else
    i = record(key, i + 3)
    out[#out + 1] = add(key, rid, body)
  end
end
return out
