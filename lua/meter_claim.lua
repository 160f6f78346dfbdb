-- meter_claim.lua: a task's start under one meter rule (TokenBucket or
-- GCRA) of the worker, for a task that waits in a meter's room (see
-- room.lua): one under several meters, or under one that shares its limit
-- fairly. Every start is at a slot the planned meter (the limiter's own
-- state) admits, decided on the Redis clock:
--
--   - a task released from the room, or holding a booking made for it at
--     its release (by ticket, see common.lua), starts at its slot if it
--     comes no later than grace after it; later, the slot is lost, and the
--     task waits in the room again;
--   - a fresh task takes room there is at the meter's next start, within
--     the caller's wait, when nobody waits in the room; or, at an instant
--     given (its start under its other meters), room there is then.
--
-- Each start also moves the starts instant (see meter_start.lua) as a start
-- at its slot would, so that tasks that start by meter_start.lua on the same
-- key are spaced from these too.
--
-- KEYS[1]  the planned instant (see common.lua)
-- KEYS[2]  the starts instant, the same form
-- KEYS[3]  the key's block (see block.lua): no start while it holds
-- KEYS[4]  by room: the room's waiters (see room.lua); by ticket: the
--          ticket; else absent
-- KEYS[5]  by room: the room; by ticket: the generation of the key's
--          tickets; else absent
-- KEYS[6]  by room: the waiters set aside (see room.lua); a fresh task
--          takes nothing while anyone waits, there or in the room
-- ARGV[1]  mode: 0 claim or take, 1 undo a take
-- ARGV[2]  n, units (1 <= n <= burst, checked by the caller)
-- ARGV[3]  burst
-- ARGV[4]  num } one unit is num/den microseconds of the rate, the fraction
-- ARGV[5]  den }   in lowest terms
-- ARGV[6]  where the task's capacity may be held: 0 nowhere, 1 a ticket,
--          2 the room
-- ARGV[7]  by room: the waiter's ID
-- claim:   ARGV[8] the instant of the start, Unix us (0: the meter's next
--            start); a held slot elsewhere is given back and room taken
--            at the instant instead
--          ARGV[9] without an instant: the longest the caller waits for
--            the meter's next start, in ticks
--          ARGV[10] grace: how late after its slot a held start may still
--            be claimed, us
-- undo:    ARGV[8], ARGV[9] the planned end instant the take returned (us,
--            ticks), ARGV[10] by room: the release the claim used, to put
--            back ("" for none)
-- ARGV[11] by room: how long the room's keys outlive a write, us
-- Returns  {status, slot_us, now_us, planned_end_us, planned_end_ticks,
--          release}
--          status 1: admitted at slot_us, by the capacity the task held
--            (release: the waiter's release, for undo)
--          status 5: admitted at slot_us, the capacity taken now (the
--            planned end is what undo needs)
--          status 0: not admitted: slot_us is when the meter would have
--            room, 0 when the room decides (others wait in it, or the
--            task does); a released waiter whose key is blocked at its
--            slot waits in the room again, in its place, till the block
--            ends
--          status 6: late: the task held a slot that passed more than grace
--            ago (slot_us); it is its no more, and a released waiter
--            waits in the room again, in its place
--          undo: status 1 when anything was given back

local mode, n = tonumber(ARGV[1]), tonumber(ARGV[2])
local burst, per_unit, den = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local source, waiter = tonumber(ARGV[6]), ARGV[7]
local now = server_now()
local tolerance = burst * per_unit
local cost = n * per_unit

-- wait_again puts a released waiter back in the room, in its place,
-- waiting as `waiting` says.
local function wait_again(waiting)
  local b1 = string.find(waiting, '|', 1, true)
  local b2 = string.find(waiting, '|', b1 + 1, true)
  redis.call('HSET', KEYS[4], waiter, waiting)
  redis.call('ZADD', KEYS[5], string.sub(waiting, b1 + 1, b2 - 1), waiter)
  for i = 4, 5 do
    redis.call('PEXPIRE', KEYS[i], ttl_ms(tonumber(ARGV[11])))
  end
end

if mode == 1 then
  local debt = ticks_until(KEYS[1], now, per_unit, den)
  local back = cancel(KEYS[1], nil, now, debt, cost, tolerance, per_unit, den, tonumber(ARGV[8]), tonumber(ARGV[9]))[1]
  if source == 2 and ARGV[10] ~= '' then
    redis.call('HSET', KEYS[4], waiter, ARGV[10])
    redis.call('PEXPIRE', KEYS[4], ttl_ms(tonumber(ARGV[11])))
  end
  return {back, 0, now, 0, 0, ''}
end

local at, grace = tonumber(ARGV[8]), tonumber(ARGV[10])

-- record moves the starts instant past a start at slot (ticks from now);
-- a start recorded after a later one leaves it where it is.
local function record(slot)
  local starts = math.max(signed_ticks(KEYS[2], now, per_unit, den) or slot, slot + cost)
  if starts > 0 then
    store_instant(KEYS[2], now, starts, per_unit, den)
  end
end

-- The capacity the task holds, and its slot (us).
local held, release = nil, ''
if source == 1 then
  local ticket = load_state(KEYS[4])
  local generation = tonumber(redis.call('GET', KEYS[5]))
  if ticket and ticket[4] == generation then
    held = ticket[1] + ceil_div(ticket[2] - tolerance, den)
  end
elseif source == 2 then
  local info = redis.call('HGET', KEYS[4], waiter)
  if info and string.sub(info, 1, 1) == '=' then
    -- "=<end us>:<end ticks>:<slot us>|..."
    local c1 = string.find(info, ':', 1, true)
    local c2 = string.find(info, ':', c1 + 1, true)
    local bar = string.find(info, '|', 1, true)
    held, release = tonumber(string.sub(info, c2 + 1, bar - 1)), info
  elseif info or redis.call('ZCARD', KEYS[5]) > 0 or redis.call('ZCARD', KEYS[6]) > 0 then
    return {0, 0, now, 0, 0, ''} -- the room decides
  end
end

if held and (at == 0 or held == at) then
  if held < now - grace then
    if release ~= '' then
      -- Back to its place in the room, to be released again.
      wait_again(string.sub(release, string.find(release, '|', 1, true) + 1))
    end
    return {6, held, now, 0, 0, ''}
  end
  local blocked = blocked_for(KEYS[3], now)
  if blocked > held - now then
    if release ~= '' then
      -- Back to its place in the room, to be released after the block.
      local waiting = string.sub(release, string.find(release, '|', 1, true) + 1)
      local bar = string.find(waiting, '|', 1, true)
      wait_again(int(now + blocked) .. string.sub(waiting, bar))
    end
    return {0, now + blocked, now, 0, 0, ''}
  end
  if release ~= '' then
    redis.call('HDEL', KEYS[4], waiter) -- used
  end
  record((held - now) * den)
  return {1, held, now, 0, 0, release}
end

-- No capacity held (or held for another instant, which is given back):
-- take room there is at the instant, or at the meter's next start.
local planned = signed_ticks(KEYS[1], now, per_unit, den)
local debt = math.max(planned or 0, 0)
if held then
  local ticket = load_state(KEYS[4])
  cancel(KEYS[1], KEYS[4], now, debt, cost, tolerance, per_unit, den, ticket[1], ticket[2])
  planned = signed_ticks(KEYS[1], now, per_unit, den)
end
local free = -2 ^ 52 -- the soonest start the planned meter admits, ticks
if planned then
  free = planned + cost - tolerance
end
local slot
if at > 0 then
  slot = (at - now) * den
  if free > slot then
    return {0, now + ceil_div(math.max(free, 0), den), now, 0, 0, ''}
  end
else
  slot = math.max(free, 0)
  if slot > tonumber(ARGV[9]) then
    return {0, now + ceil_div(slot, den), now, 0, 0, ''}
  end
  slot = ceil_div(slot, den) * den -- on a whole microsecond, as others will be
end
if blocked_for(KEYS[3], now) * den > slot then
  return {0, now + blocked_for(KEYS[3], now), now, 0, 0, ''}
end
local debt_after = math.max(planned or slot, slot) + cost
local end_us, end_ticks = 0, 0
if debt_after > 0 then
  store_instant(KEYS[1], now, debt_after, per_unit, den)
  end_us, end_ticks = instant_after(now, debt_after, den)
end
record(slot)
return {5, now + floor_div(slot, den), now, end_us, end_ticks, ''}
