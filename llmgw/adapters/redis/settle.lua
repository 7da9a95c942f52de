-- Settle one hold (llmgw/adapters/redis/limits.py): the key's token bucket gets back
-- what was held and pays what the answer used, and so does its budget period's counter;
-- the hold leaves the router's open holds. What was held is read from the open holds
-- (admit.lua wrote it), so a router can settle an admission whose answer it never
-- read (Redis stopped answering): settled with 0 used, it only gives back what it took.
-- KEYS[1]  the key's token bucket
-- KEYS[2]  this router's open holds
-- KEYS[3]  the key's budget period's counter
-- ARGV[1]  tokens per minute (0: no token bucket)
-- ARGV[2]  (unused: what was held is read from the open holds)
-- ARGV[3]  tokens used
-- ARGV[4]  the hold's id
-- ARGV[5]  "1": the key has a budget
-- ARGV[6]  tokens the budget period is charged (ARGV[3], or the hold when no usage came)
-- ARGV[7]  seconds the period's counter is kept from now (0: forever)
-- Returns 1, or 0 when the hold was already gone (reaped after this router was taken
-- for dead: it was refunded then, so it is not refunded again, only charged).

local limit, used = tonumber(ARGV[1]), tonumber(ARGV[3])
local function take(field, pattern)
  local rec = redis.call('HGET', KEYS[2], field)
  if not rec then return 0, 0 end
  redis.call('HDEL', KEYS[2], field)
  return 1, tonumber(string.match(rec, pattern)) or 0
end
local open = 0
if limit > 0 then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
  local held
  open, held = take(ARGV[4], '^%S+ (%d+) %d+$')
  local v = redis.call('HMGET', KEYS[1], 'level', 'stamp')
  local lv, st = tonumber(v[1]), tonumber(v[2])
  if lv == nil or st == nil then lv, st = limit, now end
  lv = math.min(limit, lv + math.max(0, now - st) * limit / 60)
  lv = math.min(limit, lv + held - used)
  redis.call('HSET', KEYS[1], 'level', tostring(lv), 'stamp', tostring(now))
  redis.call('EXPIRE', KEYS[1], math.ceil((limit - lv) * 60 / limit) + 1)
end
if ARGV[5] == '1' then
  local budget_open, budget_held = take(ARGV[4] .. '/budget', '^budget %S+ (%d+)$')
  local charged = tonumber(ARGV[6])
  if budget_open == 1 then open = 1 end
  if charged - budget_held ~= 0 then
    redis.call('INCRBY', KEYS[3], charged - budget_held)
    if tonumber(ARGV[7]) > 0 then redis.call('EXPIRE', KEYS[3], ARGV[7]) end
  end
end
return open
