-- leaky_bucket.lua: the leaky bucket as a meter (policing). Each admitted
-- unit pours one drop into a bucket of the given capacity that leaks at the
-- rate; a request that would overflow it is rejected whole, never queued.
--
-- KEYS[1]  state "<level>:<last us>", and ":<num>:<den>", the rate that
--          measured it, for a named limiter: the water level in ticks of
--          leak time at the instant of the last admission; absent means
--          empty
-- KEYS[2]  the key's block (see block.lua): while it holds, nothing is
--          admitted
-- ARGV[1]  mode: 0 pour n drops, 1 peek (test for n drops, write nothing),
--          2 pour n drops and say how to undo it, 3 take back out what is
--          left of n drops poured by a mode 2: ARGV[6] the instant they
--          were poured at (us), ARGV[7] the level under them then (ticks).
--          The bucket leaks from the bottom, so what time has drained of
--          the level under them no longer counts, and the rest of the
--          drain was theirs: only what remains of them is taken out.
-- ARGV[2]  n, drops requested (1 <= n <= capacity, checked by the caller)
-- ARGV[3]  capacity, in drops
-- ARGV[4]  num } one drop leaks every num/den microseconds, the fraction in
-- ARGV[5]  den }   lowest terms
-- Returns  {allowed (0|1), remaining, retry_after_us, reset_after_us, now_us}
--          and, when drops were poured, the instant they were poured at
--          and the level under them (mode 3's ARGV[6] and ARGV[7])
--
-- The level is kept in ticks of 1/den microsecond of leaking (a drop is num
-- ticks), so leaking is exact: elapsed microseconds * den ticks drain away.

local mode = tonumber(ARGV[1])
local n = tonumber(ARGV[2])
local capacity = tonumber(ARGV[3])
local num = tonumber(ARGV[4])
local den = tonumber(ARGV[5])

local now = server_now()
local level = 0
local stamp = now -- the instant the level is measured at
-- measured with another rate (a policy changed), the level drains at that
-- rate until a decision writes it, and carries over in units, rounded up:
-- its level in its own ticks and its rate, while it does
local foreign, onum, oden
local read = redis.call('MGET', KEYS[1], KEYS[2]) -- the state and the block, read ahead (see common.lua)
local state = load_state(KEYS[1], read[1])
if state then
  -- A last admission ahead of now means the clock stepped back: measure
  -- from that instant, so no leaking is counted twice.
  stamp = math.max(now, state[2])
  local drained = stamp - state[2]
  onum, oden = state[3] or num, state[4] or den
  -- compare before multiplying, so a long idle gap cannot overflow
  if drained < ceil_div(state[1], oden) then
    level = state[1] - drained * oden
    if onum ~= num or oden ~= den then
      foreign = level
      level = math.min(ceil_div(level * num, onum), 4503599627370496)
    end
  end
end
-- a named limiter's state records its rate (see common.lua's changeable)
local measured_num, measured_den
if changeable(KEYS[1]) then
  measured_num, measured_den = num, den
end
local full = capacity * num
local pour = n * num

if mode == MODE_CANCEL then
  -- What has drained since the pour went first from the level under them
  -- (a reservation of no record gives nothing back).
  local poured_at, under = tonumber(ARGV[6]) or 0, tonumber(ARGV[7]) or 0
  local drained = poured_at > 0 and math.max(0, stamp - poured_at) or math.huge
  local left = pour
  if drained > 0 then
    left = drained >= ceil_div(under + pour, den) and 0 or math.max(0, math.min(pour, under + pour - drained * den))
  end
  level = math.max(0, level - left)
  if level > 0 then
    store_state(KEYS[1], stamp - now + ceil_div(level, den), level, stamp, measured_num, measured_den)
  else
    redis.call('DEL', KEYS[1])
  end
  return {1, floor_div(full - level, num), 0, ceil_div(level, den), now, 0, 0}
end

local blocked = blocked_for(KEYS[2], now, read[2])
if blocked > 0 then
  return {0, 0, blocked, blocked, now}
end

if level + pour > full then
  if foreign then
    -- n drops fit once the old level is at most (capacity - n) drops of
    -- the old rate: its conversion, rounded up, is then exactly room
    return {0, floor_div(full - level, num), ceil_div(foreign - (capacity - n) * onum, oden), ceil_div(foreign, oden), now}
  end
  return {0, floor_div(full - level, num), ceil_div(level + pour - full, den), ceil_div(level, den), now}
end
local under = level
if mode ~= MODE_PEEK then
  level = level + pour
  store_state(KEYS[1], stamp - now + ceil_div(level, den), level, stamp, measured_num, measured_den)
end
return {1, floor_div(full - level, num), 0, ceil_div(level, den), now, stamp, under}
