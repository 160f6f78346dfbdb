-- sliding_log.lua: exact sliding window; at most limit units in any window
-- of the given length, one sorted-set entry per admitted unit.
--
-- KEYS[1]  sorted set of admitted units, scored by admission time in us;
--          members are "<us>:<seq>", unique per unit
-- ARGV[1]  mode: 0 take n units, 1 peek (test for n units, write nothing)
-- ARGV[2]  n, units requested (1 <= n <= limit, checked by the caller)
-- ARGV[3]  limit, units per window
-- ARGV[4]  window length in microseconds
-- Returns  {allowed (0|1), remaining, retry_after_us, reset_after_us, now_us}
--
-- A unit admitted at t counts while now < t + window. The set never holds
-- more than limit entries in the window, and entries that left it are
-- removed on the next admission, so memory is bounded by limit.

local mode, n, limit, window = numeric_argv()

local now = server_now()
local horizon = now - window        -- entries scored <= horizon have left
local open = '(' .. int(horizon)    -- exclusive lower bound for ZCOUNT
local count = redis.call('ZCOUNT', KEYS[1], open, '+inf')

-- newest_reset returns how long until the newest entry leaves the window.
local function newest_reset()
  local newest = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  if #newest == 0 then
    return 0
  end
  return math.max(0, tonumber(newest[2]) + window - now)
end

if count + n > limit then
  -- The request fits once the k oldest entries in the window have left.
  local k = count + n - limit
  local oldest = redis.call('ZRANGEBYSCORE', KEYS[1], open, '+inf',
    'WITHSCORES', 'LIMIT', k - 1, 1)
  local retry_after = tonumber(oldest[2]) + window - now
  return {0, limit - count, retry_after, newest_reset(), now}
end

if mode == MODE_TAKE then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', int(horizon))
  -- Entries of one score are added together and leave together, so the
  -- number already at this score is the next free sequence number.
  local seq = redis.call('ZCOUNT', KEYS[1], now, now)
  local stamp = int(now)
  local batch = {}
  for i = 1, n do
    batch[#batch + 1] = stamp
    batch[#batch + 1] = stamp .. ':' .. int(seq + i - 1)
    if #batch >= 200 or i == n then
      redis.call('ZADD', KEYS[1], unpack(batch))
      batch = {}
    end
  end
  count = count + n
  redis.call('PEXPIRE', KEYS[1], ttl_ms(window))
end
return {1, limit - count, 0, newest_reset(), now}
