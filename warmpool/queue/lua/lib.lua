-- The library every script of warmpool/queue/lua/ is prefixed with (warmpool/queue/scripts.py
-- registers each as lib.lua + the script): the key names, the server clock (NOW) and the
-- helpers the state changes share. See scripts.py's docstring for the invariants they keep.
--
-- Key names: every key name (or key-name prefix) the scripts use, as
-- warmpool.queue.layout.Layout defines it: no name is spelled here. scripts.py puts a head
-- generated for the layout before this file (scripts.head) that declares them as string
-- constants, so no call passes KEYS:
--   DIRTY INFLIGHT FAILURES DELAYED ERRORS ADDED_AT PENDING DEAD FENCE  project keys
--   LEASE TRIG OWN WAIT            prefixes of lease:<k>, trig:<k>, own:<k>, wait:<k>
--   QUEUE QUEUE_MSGS               dramatiq's main queue: its id list and messages hash
--   CLAIMS CLAIMS_MSGS             the same for the claims queue
--   XQ XQ_MSGS                     the dead letters (the main queue's, for both queues)
--   DOORBELL                       the pub/sub channel idle workers wait on (not a key)
-- and two constants: CLAIM_PREFIX (warmpool.queue.routing) and OWN_TTL (ms, scripts.py).
local clock = redis.call("TIME")
local NOW = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)

-- The dramatiq queue a key's messages go to (its id list, its messages hash): claims ahead
-- of bulk work.
local function queue_of(key)
  if string.sub(key, 1, #CLAIM_PREFIX) == CLAIM_PREFIX then return CLAIMS, CLAIMS_MSGS end
  return QUEUE, QUEUE_MSGS
end

-- The doorbell (warmpool/queue/doorbell.py): idle workers wait for a notification instead
-- of polling. Published by the script that writes, so it is atomic with the write: a worker
-- woken by it always finds the message (or the delayed key) there. The payload is the id
-- list a message went to (it has a ":"), or a delayed key's ready time in ms (digits only).
-- One PUBLISH per list per script call: an `add` of 500 keys rings once.
local rung = {}
local function ring(list)
  if rung[list] then return end
  rung[list] = true
  redis.call("PUBLISH", DOORBELL, list)
end

local function ring_delayed(ready_ms)
  redis.call("PUBLISH", DOORBELL, string.format("%d", math.floor(ready_ms)))
end

-- Exactly what dramatiq's dispatch.lua "enqueue" writes, plus our pending pointer (and the
-- doorbell).
local function enqueue(key, rid, body)
  local q, msgs = queue_of(key)
  redis.call("HSET", msgs, rid, body)
  redis.call("RPUSH", q, rid)
  redis.call("HSET", PENDING, key, rid)
  ring(q)
end

-- What dispatch.lua's "ack" writes: forget the delivery and its body (in the key's queue;
-- the other one too, for a message queued before its key's kind moved queues).
local function ack(key, acks, rid)
  if acks ~= "" and redis.call("SREM", acks, rid) > 0 then
    local _, msgs = queue_of(key)
    if redis.call("HDEL", msgs, rid) == 0 then
      if msgs == QUEUE_MSGS then msgs = CLAIMS_MSGS else msgs = QUEUE_MSGS end
      redis.call("HDEL", msgs, rid)
    end
  end
end

local function has_message(key)
  local rid = redis.call("HGET", PENDING, key)
  if not rid then return false end
  local _, msgs = queue_of(key)
  return redis.call("HEXISTS", msgs, rid) == 1
end

local function is_dirty(key)
  return redis.call("SISMEMBER", DIRTY, key) == 1
end

-- `wait:<key>`, a set; anything else there (someone else's write: Redis contents are not
-- trusted) is dropped, so it fails no script: its parked keys still run on their own timers.
local function waiters_of(key)
  local waiters = WAIT .. key
  local t = redis.call("TYPE", waiters)["ok"]
  if t ~= "set" and t ~= "none" then redis.call("DEL", waiters) end
  return waiters
end

-- The keys parked on `key`'s lease (park.lua) are due now: the lease they waited for is free.
-- A waiter added again meanwhile (dirty) already waits for a run of its own.
local function wake_waiters(key)
  local waiters = waiters_of(key)
  local parked = redis.call("SMEMBERS", waiters)
  if #parked == 0 then return end
  redis.call("DEL", waiters)
  for _, w in ipairs(parked) do
    if not is_dirty(w) then redis.call("ZADD", DELAYED, "LT", NOW, w) end
  end
  ring_delayed(NOW)  -- the promoters promote them now, not at their fallback
end

-- Redis contents are not trusted: every number read back is checked before use (a script
-- that fails half way leaves its earlier writes in place, and a parse that fails on one key's
-- garbage must not stop the others). A lease value is "<fence>|<token>", the fence at most 19
-- digits, the whole at most 1024 bytes.
local function shown(raw)
  if #raw > 40 then return string.format("%q (%d bytes)", string.sub(raw, 1, 40), #raw) end
  return string.format("%q", raw)
end

-- The repair notes of one script call, joined for its reply ("" when nothing was repaired).
local function notes(...)
  local out = {}
  for i = 1, select("#", ...) do  -- not ipairs: it stops at the first nil
    local p = select(i, ...)
    if p and p ~= "" then out[#out + 1] = p end
  end
  return table.concat(out, "; ")
end

-- Decimal digits without leading zeros, or nil: at most 19 of them (int64's width).
local function canonical(text)
  local digits = string.match(text, "^0*(%d+)$")
  if digits and #digits <= 19 then return digits end
  return nil
end

-- The key's lease value and nil, or nil and what is wrong with what is there (another type,
-- text that is not a lease value: someone else's write). Nothing is changed here.
local function lease_value(key)
  local raw = redis.pcall("GET", LEASE .. key)
  if type(raw) == "table" then return nil, "lease key of another type deleted" end
  if not raw then return nil end
  local fence = string.match(raw, "^(%d+)|.")
  if fence and #raw <= 1024 and canonical(fence) == fence then return raw end
  return nil, string.format("unreadable lease value deleted: %s", shown(raw))
end

-- Leased by a holder of ours: what is not a lease value holds nothing (`start` repairs it).
local function leased(key)
  return lease_value(key) ~= nil
end

-- a >= b for resourceVersions (decimal strings of any length); other text only if equal.
local function rv_ge(a, b)
  local x, y = string.match(a, "^0*(%d+)$"), string.match(b, "^0*(%d+)$")
  if not (x and y) then return a == b end
  if #x ~= #y then return #x > #y end
  return x >= y
end

-- Merge one trigger (or own write) into a hash: "Kind/name" keeps the highest version,
-- "Kind/name#gone" (a uid) and "*" the last written.
local function note(hash, field, value)
  if field ~= "*" and string.sub(field, -5) ~= "#gone" then
    local old = redis.call("HGET", hash, field)
    if old and rv_ge(old, value) then return end
  end
  redis.call("HSET", hash, field, value)
end

local function untriggered(key)
  redis.call("HSET", TRIG .. key, "*", "1")
end

-- ARGV[i] = n, then n (field, value) pairs: the add's triggers; n = 0 records "*".
-- Returns the index after them.
local function record(key, i)
  local n = tonumber(ARGV[i])
  if n == 0 then
    untriggered(key)
  else
    local hash = TRIG .. key
    for j = i + 1, i + 2 * n, 2 do note(hash, ARGV[j], ARGV[j + 1]) end
  end
  return i + 1 + 2 * n
end

-- Returns true if the key was not dirty before. A delayed run it supersedes was owed
-- whatever the versions (a retry, a defer): it carries over as "*".
local function mark_dirty(key)
  if redis.call("ZREM", DELAYED, key) == 1 then untriggered(key) end
  if redis.call("SADD", DIRTY, key) == 0 then return false end
  redis.call("HSETNX", ADDED_AT, key, NOW)
  return true
end

local function add(key, rid, body)
  if not mark_dirty(key) then return "deduplicated" end
  if leased(key) then return "rerun" end
  enqueue(key, rid, body)
  return "enqueued"
end

-- Every trigger ({field, value, ...}) matched by the key's own writes, and no "*"?
local function own_covers(key, trig)
  for i = 1, #trig, 2 do
    if trig[i] == "*" then return false end
  end
  local own = OWN .. key
  for i = 1, #trig, 2 do
    local field, want = trig[i], trig[i + 1]
    local mine = redis.call("HGET", own, field)
    if not mine then return false end
    if string.sub(field, -5) == "#gone" then
      if mine ~= want then return false end
    elseif not rv_ge(mine, want) then
      return false
    end
  end
  return true
end

-- The counter as an exact decimal string, or nil with what was wrong when it is not one we can
-- INCR safely (text someone wrote, another type, a value within reach of int64's end): then
-- it is deleted, as if Redis had lost it, and the objects' fences lift it back (check_fence).
local function fence_counter()
  local raw = redis.pcall("GET", FENCE)
  if type(raw) == "table" then
    redis.call("DEL", FENCE)
    return nil, "fence counter of another type deleted"
  end
  if not raw then return nil end
  local digits = canonical(raw)
  if not digits or not rv_ge(FENCE_SAFE, digits) then
    redis.call("DEL", FENCE)
    return nil, string.format("unusable fence counter deleted: %s", shown(raw))
  end
  return digits
end

-- Whether the key's last run was lost and is still owed: a deadline in `inflight` while no
-- lease is there (every caller checks the lease first). Only `done` with the holder's own
-- token and `recover` remove a deadline; a lease that lapsed (a holder SIGSTOPped or starved
-- of CPU past the TTL), or was deleted as unreadable, leaves it for the recovery pass. A
-- script that takes the key before that pass must take the debt with it, since its ZADD
-- replaces the deadline recovery would have found: without that, a secondary lease taken and
-- released in between erased the lost run, and its key never ran again.
local function owes_lost_run(key)
  return redis.call("ZSCORE", INFLIGHT, key) ~= false
end

-- INCR, then the counter's exact decimal text: never a Lua number (a double, which prints
-- 10^14 as "1e+14" and is not exact above 2^53). Returns value, fence text, repair note.
local function acquire(key, token, ttl)
  local _, problem = fence_counter()
  redis.call("INCR", FENCE)
  local fence = redis.call("GET", FENCE)
  local value = fence .. "|" .. token
  redis.call("SET", LEASE .. key, value, "PX", ttl)
  redis.call("ZADD", INFLIGHT, NOW + tonumber(ttl), key)
  return value, fence, problem
end

-- A lease read for taking the key: anything there that is not a lease value of ours is
-- deleted (else it would block the key until it expired, or for good without a TTL) and
-- reported. Returns the holder's value or nil, and the repair note or nil.
local function take_lease_of(key)
  local value, problem = lease_value(key)
  if problem then redis.call("DEL", LEASE .. key) end
  return value, problem
end

-- Consecutive failures of a key; a count that is not a small number (someone else's text) is
-- dropped, as after a success, so HINCRBY cannot fail on it. Returns count, repair note.
local function failures_of(key)
  local raw = redis.call("HGET", FAILURES, key)
  if not raw then return 0 end
  if string.match(raw, "^%d+$") and #raw <= 9 then return tonumber(raw) end
  redis.call("HDEL", FAILURES, key)
  return 0, string.format("unreadable failure count dropped: %s", shown(raw))
end

local function clear_dead(key)
  local old = redis.call("HGET", DEAD, key)
  if old then
    redis.call("ZREM", XQ, old)
    redis.call("HDEL", XQ_MSGS, old)
    redis.call("HDEL", DEAD, key)
  end
end

-- One dead letter per key, in dramatiq's own dead-letter queue (the main queue's).
local function dead_letter(key, rid, body)
  clear_dead(key)
  redis.call("ZADD", XQ, NOW, rid)
  redis.call("HSET", XQ_MSGS, rid, body)
  redis.call("HSET", DEAD, key, rid)
  redis.call("HDEL", FAILURES, key)
  redis.call("ZREM", DELAYED, key)
end

-- Count a failure; dead-letter at max. Returns failures, dead?
local function fail(key, err, max, dead_rid, dead_body)
  failures_of(key)  -- garbage there would make HINCRBY fail: counted from 0 instead
  local n = redis.call("HINCRBY", FAILURES, key, 1)
  redis.call("HSET", ERRORS, key, err)
  if n >= tonumber(max) then
    dead_letter(key, dead_rid, dead_body)
    return n, true
  end
  return n, false
end

local function orphaned(key)
  return is_dirty(key) and not leased(key) and not has_message(key)
end
