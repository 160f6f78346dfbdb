-- room.lua: the waiting room of one meter key (TokenBucket or GCRA) of the
-- worker: tasks that could not start wait here, out of asynq's way, and are
-- released one by one, each with the capacity for its start reserved, as
-- the meter's rate allows. Releases go in start-time fair queueing order
-- over the waiters' flows (a flow is what a rule shares its limit by, such
-- as a tenant; a room whose rule shares by nothing has one flow, so it is
-- first come, first served): each waiter gets a start tag
-- S = max(V, F(flow)) when it enters, its flow's finish tag becomes
-- F(flow) = S + scale / weight, and the waiter with the lowest tag goes
-- first, V becoming its tag. A heavy flow that entered first does not hold
-- back a newcomer, whose first waiter is tagged V.
--
-- KEYS[1]  the planned instant of the meter key (see common.lua)
-- KEYS[2]  the room: sorted set of waiter IDs by start tag
-- KEYS[3]  the waiters: hash of waiter ID -> "<eligible us>|<payload>"
--          while waiting, "=<end us>:<end ticks>|<payload>" once released
--          (the capacity of its start reserved, up to the instant given,
--          for meter_start.lua to find)
-- KEYS[4]  the flows: hash of flow -> finish tag; field "" holds V
-- ARGV[1]  mode: 0 enter, 1 release, 2 leave
-- enter:   ARGV[2] waiter ID, ARGV[3] flow, ARGV[4] weight (>= 1),
--          ARGV[5] eligible: the soonest it may start, Unix us,
--          ARGV[6] payload (opaque to the script, no '|'), ARGV[7] how long
--          the room's keys outlive their last write, us
--          Returns {waiters in the room, 1 if it entered now (0: it was
--          there, or is released), now_us}
-- release: ARGV[2] n, ARGV[3] burst, ARGV[4] num, ARGV[5] den (the meter),
--          ARGV[6] lead: how long before its start a waiter is released,
--          in ticks, ARGV[7] keys' lifetime, us
--          Returns {1, waiter ID, payload, start delay us, now_us} for a
--          waiter released; {0, due_us, now_us} otherwise, due_us the
--          instant to try again (0: the room is empty)
-- leave:   ARGV[2] waiter ID: removes a waiter, or a release nobody came
--          for. Returns {1 if it was there, now_us}

local SCALE = 1000000 -- a tag's unit: weights divide it
local SCAN = 64       -- waiters looked at per release for an eligible one

local mode = tonumber(ARGV[1])
local now = server_now()

-- keep renews the expiry of the room's keys.
local function keep(lifetime)
  for i = 2, 4 do
    redis.call('PEXPIRE', KEYS[i], ttl_ms(lifetime))
  end
end

if mode == 0 then
  local id, flow, weight = ARGV[2], ARGV[3], tonumber(ARGV[4])
  local existing = redis.call('HGET', KEYS[3], id)
  if existing then
    return {redis.call('ZCARD', KEYS[2]), 0, now}
  end
  local v = tonumber(redis.call('HGET', KEYS[4], '')) or 0
  local finish = tonumber(redis.call('HGET', KEYS[4], flow)) or 0
  local tag = math.max(v, finish)
  redis.call('HSET', KEYS[4], flow, int(tag + math.max(1, floor_div(SCALE, weight))))
  redis.call('ZADD', KEYS[2], int(tag), id)
  redis.call('HSET', KEYS[3], id, ARGV[5] .. '|' .. ARGV[6])
  keep(tonumber(ARGV[7]))
  return {redis.call('ZCARD', KEYS[2]), 1, now}
end

if mode == 2 then
  local id = ARGV[2]
  redis.call('ZREM', KEYS[2], id)
  return {redis.call('HDEL', KEYS[3], id), now}
end

-- release
local n, burst, per_unit, den = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local lead = tonumber(ARGV[6])
local tolerance = burst * per_unit
local cost = n * per_unit
local debt = ticks_until(KEYS[1], now, den)
-- The next start the meter admits comes after wait ticks.
local wait = debt + cost - tolerance
if wait > lead then
  if redis.call('ZCARD', KEYS[2]) == 0 then
    return {0, 0, now}
  end
  return {0, now + ceil_div(wait - lead, den), now}
end
local start = math.max(wait, 0)
local horizon = now + ceil_div(start + lead, den) -- eligible by then
local soonest = 0
local waiters = redis.call('ZRANGE', KEYS[2], 0, SCAN - 1, 'WITHSCORES')
for i = 1, #waiters, 2 do
  local id = waiters[i]
  local info = redis.call('HGET', KEYS[3], id)
  if not info or string.sub(info, 1, 1) == '=' then
    redis.call('ZREM', KEYS[2], id) -- left, expired, or released
  else
    local bar = string.find(info, '|', 1, true)
    local eligible = tonumber(string.sub(info, 1, bar - 1)) -- nil once released
    if eligible <= horizon then
      local payload = string.sub(info, bar + 1)
      -- Reserve its start: the meter's instant moves as a unit started
      -- then would move it.
      if eligible > now then
        start = math.max(start, (eligible - now) * den)
      end
      debt = math.max(debt, start) + cost
      store_instant(KEYS[1], now, debt, den)
      local end_us, end_ticks = instant_after(now, debt, den)
      redis.call('ZREM', KEYS[2], id)
      redis.call('HSET', KEYS[3], id, '=' .. int(end_us) .. ':' .. int(end_ticks) .. '|' .. payload)
      redis.call('HSET', KEYS[4], '', waiters[i + 1])
      keep(tonumber(ARGV[7]))
      return {1, id, payload, ceil_div(start, den), now}
    end
    if soonest == 0 or eligible < soonest then
      soonest = eligible
    end
  end
end
if soonest == 0 then
  if redis.call('ZCARD', KEYS[2]) == 0 then
    return {0, 0, now}
  end
  soonest = now + 1000 -- only released or expired waiters were looked at
end
return {0, math.max(now, soonest - ceil_div(lead, den)), now}
