-- Return a dead router's open holds to their keys' buckets (llmgw/adapters/redis/limits.py).
-- A router is dead when its heartbeat key has expired; any live router may reap it, and
-- the check is repeated here so a router that came back in between keeps its holds.
-- KEYS[1]  the dead router's heartbeat key
-- KEYS[2]  its open holds
-- KEYS[3]  the set of routers
-- ARGV[1]  its id
-- Returns the number of holds returned, or -1 when the router is alive after all.

if redis.call('EXISTS', KEYS[1]) == 1 then return -1 end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local holds = redis.call('HGETALL', KEYS[2])
local returned = 0
for i = 2, #holds, 2 do
  local counter, taken = string.match(holds[i], '^budget (%S+) (%d+)$')
  local bucket, held, limit = string.match(holds[i], '^(%S+) (%d+) (%d+)$')
  if counter then
    -- A budget period's counter: an expired one (a period past) stays gone.
    if redis.call('EXISTS', counter) == 1 then redis.call('DECRBY', counter, tonumber(taken)) end
    returned = returned + 1
  elseif bucket then
    held, limit = tonumber(held), tonumber(limit)
    local v = redis.call('HMGET', bucket, 'level', 'stamp')
    local lv, st = tonumber(v[1]), tonumber(v[2])
    if lv ~= nil and st ~= nil then  -- an absent bucket is full already
      lv = math.min(limit, lv + math.max(0, now - st) * limit / 60 + held)
      redis.call('HSET', bucket, 'level', tostring(lv), 'stamp', tostring(now))
      redis.call('EXPIRE', bucket, math.ceil((limit - lv) * 60 / limit) + 1)
    end
    returned = returned + 1
  end
end
redis.call('DEL', KEYS[2])
redis.call('SREM', KEYS[3], ARGV[1])
return returned
