-- tick_claim.lua: the replicas' claims on the ticks of one scheduled entry,
-- so that each tick's batch is produced by one replica at a time, and to
-- its end even when that replica stops or dies halfway.
--
-- KEYS[1]  hash of the ticks being produced: field = the tick (Unix us),
--          value = "<replica>:<claim expiry us>"; a claim whose expiry has
--          passed has lapsed (its replica stopped renewing it) and another
--          replica may take the tick over
-- KEYS[2]  sorted set of the ticks produced to their end: member = the tick
--          (Unix us), score = until when it is remembered (us)
-- ARGV[1]  mode: 0 claim, 1 renew, 2 finish, 3 release, 4 recover
-- ARGV[2]  the replica's ID (no ':')
-- ARGV[3]  the tick, Unix us (claim, renew, finish, release); recover: the
--          oldest tick still taken over (us), older lapsed ones are dropped
-- ARGV[4]  claim, renew, recover: how long a claim lives unrenewed (us);
--          finish: how long the finished tick is remembered (us)
-- ARGV[5]  how long the hash outlives its last write (us)
-- Returns  claim, renew, finish, release: 1 when the claim is (still) this
--          replica's, else 0; recover: the tick taken over, or 0

local mode = tonumber(ARGV[1])
local replica = ARGV[2]
local tick = ARGV[3]
local span = tonumber(ARGV[4])
local keep_hash = tonumber(ARGV[5])

local now = server_now()
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', int(now))

-- holder returns the replica holding a claim and its expiry.
local function holder(value)
  local colon = string.find(value, ':', 1, true)
  return string.sub(value, 1, colon - 1), tonumber(string.sub(value, colon + 1))
end

-- take writes this replica's claim on t, expiring after span.
local function take(t, expires)
  redis.call('HSET', KEYS[1], t, replica .. ':' .. int(expires))
  redis.call('PEXPIRE', KEYS[1], ttl_ms(keep_hash))
end

-- ours reports whether this replica holds the claim on tick.
local function ours()
  local value = redis.call('HGET', KEYS[1], tick)
  return value and holder(value) == replica
end

if mode == 0 then
  if redis.call('ZSCORE', KEYS[2], tick) then
    return 0
  end
  local value = redis.call('HGET', KEYS[1], tick)
  if value then
    local _, expires = holder(value)
    if expires > now then
      return 0
    end
  end
  take(tick, now + span)
  return 1
elseif mode == 1 then
  if not ours() then
    return 0
  end
  take(tick, now + span)
  return 1
elseif mode == 2 then
  if not ours() then
    return 0
  end
  redis.call('HDEL', KEYS[1], tick)
  redis.call('ZADD', KEYS[2], int(now + span), tick)
  if redis.call('PTTL', KEYS[2]) < ceil_div(span, 1000) then
    redis.call('PEXPIRE', KEYS[2], ttl_ms(span))
  end
  return 1
elseif mode == 3 then
  if not ours() then
    return 0
  end
  take(tick, 0) -- lapsed at once: the next replica to look takes it over
  return 1
elseif mode == 4 then
  local oldest = tonumber(tick)
  local fields = redis.call('HGETALL', KEYS[1])
  for i = 1, #fields, 2 do
    local t = fields[i]
    local _, expires = holder(fields[i + 1])
    if expires <= now then
      if tonumber(t) < oldest or redis.call('ZSCORE', KEYS[2], t) then
        redis.call('HDEL', KEYS[1], t)
      else
        take(t, now + span)
        return tonumber(t)
      end
    end
  end
  return 0
end
return redis.error_reply('tick_claim.lua: unknown mode ' .. tostring(ARGV[1]))
