-- bench/token_bucket.lua: a Redis token bucket of the kind the seed articles
-- describe (what senders put beside their queue today), written for this
-- benchmark.  It does the same work per call as that design: read the server
-- clock, read the bucket hash, refill, take, write the hash back, renew its
-- expiry.  bench/run loads it with SCRIPT LOAD and calls
--     EVALSHA <sha> 1 <key> <rate> <capacity> <tokens>
-- and it answers {granted 0|1, tokens left, seconds to wait}.
local key = KEYS[1]
local rate, cap, want = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])

local clock = redis.call('TIME')                 -- one clock for every client
local now = clock[1] + clock[2] / 1e6

local held, at = unpack(redis.call('HMGET', key, 'tokens', 'ts'))
held, at = tonumber(held), tonumber(at)
if not held or not at then                       -- unknown key: a full bucket
  held, at = cap, now
end

if now > at then                                 -- no refill for a clock step back
  held = math.min(cap, held + (now - at) * rate)
end

local granted, wait = 0, 0
if held >= want then
  held, granted = held - want, 1
else
  wait = (want - held) / rate
end

redis.call('HSET', key, 'tokens', held, 'ts', now)
redis.call('EXPIRE', key, math.ceil(cap / rate) + 60)
-- floats as strings: Redis would truncate Lua numbers to integers
return {granted, tostring(held), tostring(wait)}
