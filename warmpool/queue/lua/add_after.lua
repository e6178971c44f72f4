-- ARGV: key, delay_ms, n, n x (field, value). A dirty key already runs as soon as it can:
-- moving it later would break "re-adding only moves the ready time earlier", so that is a
-- no-op (the triggers still count), as is a later time for a key already delayed (ZADD LT).
local key = ARGV[1]
record(key, 3)
if is_dirty(key) then return "deduplicated" end
local changed = redis.call("ZADD", DELAYED, "LT", "CH", NOW + tonumber(ARGV[2]), key)
if changed == 1 then return "delayed" end
return "deduplicated"
