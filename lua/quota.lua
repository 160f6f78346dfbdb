-- quota.lua: at most limit units per calendar period (a day or a month in
-- a time zone), the periods' bounds given by the caller, which knows the
-- zone's calendar; the clock is Redis's.
--
-- KEYS[1]  state "<period start us>:<count>:<period end us>"; absent means
--          nothing counted. Counted in another period (the policy's zone or
--          period changed), the count carries over into the current period
--          while the period it was counted in lasts.
-- KEYS[2]  the key's block (see block.lua): while it holds, nothing is
--          admitted
-- ARGV[1]  mode: 0 take n units, 1 peek (test for n units, write nothing),
--          2 take n units and say how to undo it, 3 undo a take
-- ARGV[2]  n, units requested (1 <= n <= limit, checked by the caller)
-- ARGV[3]  limit, units per period
-- ARGV[4]  undo: the start of the period the units were taken in (us)
-- ARGV[5]  unused (undo's second value)
-- ARGV[6..] the bounds of consecutive periods, ascending, Unix us: each
--          period runs from one bound up to the next
-- Returns  {allowed (0|1), remaining, retry_after_us, reset_after_us, now_us}
--          and, for mode 2, the period's start and 0 (what undo needs);
--          {-1, 0, 0, 0, now_us} when now lies outside the bounds given
--          (the caller's clock is far from Redis's): ask again with bounds
--          around now_us.

local mode = tonumber(ARGV[1])
local n = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
local taken_in = tonumber(ARGV[4])

local now = server_now()
local start, finish
for i = 6, #ARGV - 1 do
  local from, to = tonumber(ARGV[i]), tonumber(ARGV[i + 1])
  if from <= now and now < to then
    start, finish = from, to
    break
  end
end
if not start then
  return {-1, 0, 0, 0, now}
end

local count = 0
local read = redis.call('MGET', KEYS[1], KEYS[2]) -- the state and the block, read ahead (see common.lua)
local state = load_state(KEYS[1], read[1])
if state and state[3] > now then
  -- counted in this period, or in one of another calendar still running
  count = state[2]
  if state[1] ~= start then
    state = nil -- carried over into the current period
  end
end

if mode == MODE_CANCEL then
  if state and state[1] == taken_in then
    count = math.max(0, count - n)
    store_state(KEYS[1], finish - now, start, count, finish)
  end
  return {1, limit - count, 0, 0, now}
end

local until_end = finish - now
local blocked = blocked_for(KEYS[2], now, read[2])
if blocked > 0 then
  return {0, 0, blocked, blocked, now}
end
if count + n > limit then
  return {0, math.max(0, limit - count), until_end, until_end, now}
end
if mode ~= MODE_PEEK then
  count = count + n
  store_state(KEYS[1], until_end, start, count, finish)
end
local reset_after = 0
if count > 0 then
  reset_after = until_end
end
return {1, limit - count, 0, reset_after, now, start, 0}
