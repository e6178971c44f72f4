-- ARGV: acks key, rid, the delivering queue's messages hash -> 1 moved | 0.
-- dispatch.lua's "nack", except that the dead letter goes to the main queue's `.XQ` whatever
-- queue the message came from: one dead-letter place (for dramatiq's own rejections of
-- claims messages, e.g. an unknown actor).
local acks, rid, msgs = ARGV[1], ARGV[2], ARGV[3]
if redis.call("SREM", acks, rid) == 0 then return 0 end
local body = redis.call("HGET", msgs, rid)
if not body then return 0 end
redis.call("ZADD", XQ, NOW, rid)
redis.call("HSET", XQ_MSGS, rid, body)
redis.call("HDEL", msgs, rid)
return 1
