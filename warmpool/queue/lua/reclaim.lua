-- ARGV: acks, queue list, msgs, rid... -> how many went back. The deliveries of a live
-- worker's ack set that its consumer does not hold (a fetch whose reply was lost: the fetch ran,
-- its ids moved to the ack set, the bodies never arrived), back at the head of their queue:
-- they have waited longest. Each only if still in the ack set, so a late ack or requeue that
-- got there first wins and nothing is queued twice; a message whose body is gone (acked by a
-- duplicate delivery's skip) is only forgotten, as in dispatch.lua's "requeue". A keyed key
-- keeps its `pending` pointer (same id), so it has a message again; a duplicate delivery, if
-- the consumer did hold it after all, is skipped by `start` (busy or stale) and acked.
local acks, list, msgs = ARGV[1], ARGV[2], ARGV[3]
local moved = 0
for i = #ARGV, 4, -1 do
  local rid = ARGV[i]
  if redis.call("SREM", acks, rid) > 0 and redis.call("HEXISTS", msgs, rid) == 1 then
    redis.call("LPUSH", list, rid)
    moved = moved + 1
  end
end
if moved > 0 then ring(list) end
return moved
