-- sliding_log.lua: exact sliding window; at most limit units in any window
-- of the given length, one sorted-set entry per admitted unit.
--
-- KEYS[1]  sorted set of admitted units, scored by admission time in us;
--          members are "<us>:<seq>", unique per unit (seq numbers the units
--          admitted in one microsecond)
-- KEYS[2]  the key's block (see block.lua): while it holds, nothing is
--          admitted
-- ARGV[1]  mode: 0 take n units, 1 peek (test for n units, write nothing),
--          2 take n units and say how to undo it, 3 undo a take
-- ARGV[2]  n, units requested (1 <= n <= limit, checked by the caller)
-- ARGV[3]  limit, units per window (at most 10,000, checked by the caller:
--          the loops below write or remove up to limit entries)
-- ARGV[4]  window length in microseconds
-- ARGV[5]  undo: the admission time of the units (us)
-- ARGV[6]  undo: the sequence number of the first of them
-- Returns  {allowed (0|1), remaining, retry_after_us, reset_after_us, now_us}
--          and, for mode 2, the admission time and first sequence number
--
-- A unit admitted at t counts while now < t + window. The set never holds
-- more than limit entries in the window, and entries that left it are
-- removed on the next admission, so memory is bounded by limit.

local mode = tonumber(ARGV[1])
local n = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
local window = tonumber(ARGV[4])
local taken_at = tonumber(ARGV[5])
local first_seq = tonumber(ARGV[6])

local now = server_now()

if mode == MODE_CANCEL then
  local stamp = int(taken_at)
  local batch = {}
  for i = 0, n - 1 do
    batch[#batch + 1] = stamp .. ':' .. int(first_seq + i)
    if #batch >= 200 or i == n - 1 then
      redis.call('ZREM', KEYS[1], unpack(batch))
      batch = {}
    end
  end
  return {1, 0, 0, 0, now}
end

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

local blocked = blocked_for(KEYS[2], now)
if blocked > 0 then
  return {0, 0, blocked, blocked, now}
end

if count + n > limit then
  -- The request fits once the k oldest entries in the window have left.
  local k = count + n - limit
  local oldest = redis.call('ZRANGEBYSCORE', KEYS[1], open, '+inf',
    'WITHSCORES', 'LIMIT', k - 1, 1)
  local retry_after = tonumber(oldest[2]) + window - now
  return {0, limit - count, retry_after, newest_reset(), now}
end

local seq = 0
if mode ~= MODE_PEEK then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', int(horizon))
  -- Members admitted at this very microsecond (rare but for a frozen
  -- clock) take the sequence numbers after the highest already there.
  local stamp = int(now)
  for _, member in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], stamp, stamp)) do
    seq = math.max(seq, tonumber(string.sub(member, #stamp + 2)) + 1)
  end
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
return {1, limit - count, 0, newest_reset(), now, now, seq}
