-- Settle one hold (llmgw/adapters/redis/limits.py): the key's token bucket gets back
-- what was held and pays what the answer used; the hold leaves the router's open holds.
-- KEYS[1]  the key's token bucket
-- KEYS[2]  this router's open holds
-- ARGV[1]  tokens per minute
-- ARGV[2]  tokens held
-- ARGV[3]  tokens used
-- ARGV[4]  the hold's id
-- Returns 1, or 0 when the hold was already gone (reaped after this router was taken
-- for dead: it was refunded then, so it is not refunded again, only charged).

local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local limit, held, used = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local open = redis.call('HDEL', KEYS[2], ARGV[4])
if open == 0 then held = 0 end
local v = redis.call('HMGET', KEYS[1], 'level', 'stamp')
local lv, st = tonumber(v[1]), tonumber(v[2])
if lv == nil or st == nil then lv, st = limit, now end
lv = math.min(limit, lv + math.max(0, now - st) * limit / 60)
lv = math.min(limit, lv + held - used)
redis.call('HSET', KEYS[1], 'level', tostring(lv), 'stamp', tostring(now))
redis.call('EXPIRE', KEYS[1], math.ceil((limit - lv) * 60 / limit) + 1)
return open
