-- Admit one request of an API key against limits every router shares (llmgw/adapters/redis/limits.py).
-- One script, so the check and the take are one atomic step on the server: two routers
-- can never both take the last token. Time is the server's (TIME), so routers' clocks
-- never disagree about a bucket.
--
-- KEYS[1]  the key's request bucket (hash: level, stamp)
-- KEYS[2]  the key's token bucket
-- KEYS[3]  this router's open holds (hash: hold id -> "token-bucket-key held limit",
--          hold id .. "/budget" -> "budget budget-key held")
-- KEYS[4]  the key's budget period's counter (tokens used, plus what open requests hold)
-- ARGV[1]  requests per minute (0: no limit)
-- ARGV[2]  tokens per minute (0: no limit)
-- ARGV[3]  tokens to hold (at most the limit)
-- ARGV[4]  "1": an answer nothing bounds, which holds all the key has left
-- ARGV[5]  the hold's id
-- ARGV[6]  the key's token budget for the period (0: no budget)
-- ARGV[7]  tokens to hold from the budget
-- ARGV[8]  seconds the period's counter is kept from now (0: forever)
-- Returns {1, "", "0", held, budget left after} when admitted, else {0, kind, seconds to
-- wait, held asked, budget left}; kind "budget" when the period's budget has too little left
-- (core/budgets.py's budget_decision, taken here atomically).
-- Floats are returned as strings: Redis truncates a Lua number in a reply to an integer.

local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000

local function level(key, limit)
  local v = redis.call('HMGET', key, 'level', 'stamp')
  local lv, st = tonumber(v[1]), tonumber(v[2])
  if lv == nil or st == nil then return limit end  -- an absent bucket is a full one
  return math.min(limit, lv + math.max(0, now - st) * limit / 60)
end

-- A bucket is written with the time it takes to refill as its expiry: an absent bucket
-- reads as full, so a key that stops sending leaves nothing behind.
local function store(key, lv, limit)
  redis.call('HSET', key, 'level', tostring(lv), 'stamp', tostring(now))
  redis.call('EXPIRE', key, math.ceil((limit - lv) * 60 / limit) + 1)
end

local rpm, tpm = tonumber(ARGV[1]), tonumber(ARGV[2])
local held = 0
local tokens_level = 0
if tpm > 0 then
  tokens_level = level(KEYS[2], tpm)
  held = math.min(math.max(0, tonumber(ARGV[3])), tpm)
  if tokens_level < held then
    return {0, 'tokens', tostring((held - tokens_level) * 60 / tpm), held, 0}
  end
end
local budget = tonumber(ARGV[6])
local budget_hold = math.max(0, tonumber(ARGV[7]))
local budget_left = 0
if budget > 0 then
  local used = math.max(0, tonumber(redis.call('GET', KEYS[4]) or '0'))
  budget_left = math.max(0, budget - used)
  if budget_left <= 0 or budget_hold > budget_left then
    return {0, 'budget', '0', budget_hold, budget_left}
  end
end
if rpm > 0 then
  local requests_level = level(KEYS[1], rpm)
  if requests_level < 1 then
    return {0, 'requests', tostring((1 - requests_level) * 60 / rpm), 0, 0}
  end
  store(KEYS[1], requests_level - 1, rpm)
end
if tpm > 0 then
  if ARGV[4] == '1' then held = math.max(held, math.floor(tokens_level)) end
  store(KEYS[2], tokens_level - held, tpm)
  if held > 0 then
    redis.call('HSET', KEYS[3], ARGV[5], KEYS[2] .. ' ' .. held .. ' ' .. tpm)
  end
end
if budget > 0 then
  redis.call('INCRBY', KEYS[4], budget_hold)
  if tonumber(ARGV[8]) > 0 then redis.call('EXPIRE', KEYS[4], ARGV[8]) end
  if budget_hold > 0 then
    redis.call('HSET', KEYS[3], ARGV[5] .. '/budget', 'budget ' .. KEYS[4] .. ' ' .. budget_hold)
  end
  budget_left = budget_left - budget_hold
end
return {1, '', '0', held, budget_left}
