-- concurrency.lua: at most limit holders of a key at once. Holders are
-- members of a sorted set scored by the instant their lease expires; a
-- holder that stops renewing drops out when its lease runs out.
--
-- KEYS[1]  sorted set of holders: member = holder id, score = lease expiry
--          in microseconds
-- ARGV[1]  mode: 0 acquire, 1 peek (count only, write nothing),
--          2 release, 3 renew
-- ARGV[2]  holder id (acquire, release, renew)
-- ARGV[3]  limit, the most holders at once
-- ARGV[4]  lease length in microseconds
-- Returns  {ok (0|1), free slots, retry_after_us, reset_after_us, now_us}
--          acquire: ok = acquired; when full, retry_after_us estimates the
--            wait as the time until the oldest lease runs out
--          release: ok = the lease was still held (0: it had expired)
--          renew: ok = the lease was still held and now runs lease again
--          reset_after_us: until the last current lease runs out

local MODE_ACQUIRE, MODE_RELEASE, MODE_RENEW = 0, 2, 3
local mode = tonumber(ARGV[1])
local limit = tonumber(ARGV[3])
local lease = tonumber(ARGV[4])
local holder = ARGV[2]

local now = server_now()
local open = '(' .. int(now) -- leases expiring after now are live

-- live returns the number of live holders.
local function live()
  return redis.call('ZCOUNT', KEYS[1], open, '+inf')
end

-- until_last returns how long until the last lease runs out.
local function until_last()
  local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  if #last == 0 then
    return 0
  end
  return math.max(0, tonumber(last[2]) - now)
end

-- prune drops expired holders and renews the key's expiry to outlive
-- every lease in it.
local function prune()
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', int(now))
  local rest = until_last()
  if rest > 0 then
    redis.call('PEXPIRE', KEYS[1], ttl_ms(rest))
  end
end

if mode == MODE_RELEASE or mode == MODE_RENEW then
  local score = redis.call('ZSCORE', KEYS[1], holder)
  local held = score and tonumber(score) > now
  if mode == MODE_RENEW and held then
    redis.call('ZADD', KEYS[1], 'XX', int(now + lease), holder)
  else
    redis.call('ZREM', KEYS[1], holder)
  end
  prune()
  local ok = 0
  if held then
    ok = 1
  end
  return {ok, math.max(0, limit - live()), 0, until_last(), now}
end

local count = live()
if count >= limit then
  local oldest = redis.call('ZRANGEBYSCORE', KEYS[1], open, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
  return {0, 0, tonumber(oldest[2]) - now, until_last(), now}
end
if mode == MODE_ACQUIRE then
  redis.call('ZADD', KEYS[1], int(now + lease), holder)
  prune()
  count = count + 1
end
return {1, limit - count, 0, until_last(), now}
