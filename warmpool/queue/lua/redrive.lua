-- ARGV: dead rid, key ("" for a message that is not keyed), new rid, new body ->
--   "missing" | add() result | "enqueued"
local drid, key, rid, body = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
if not redis.call("ZSCORE", XQ, drid) then return "missing" end
redis.call("ZREM", XQ, drid)
redis.call("HDEL", XQ_MSGS, drid)
if key == "" then
  redis.call("HSET", QUEUE_MSGS, rid, body)
  redis.call("RPUSH", QUEUE, rid)
  ring(QUEUE)
  return "enqueued"
end
if redis.call("HGET", DEAD, key) == drid then redis.call("HDEL", DEAD, key) end
redis.call("HDEL", FAILURES, key)
untriggered(key)
return add(key, rid, body)
