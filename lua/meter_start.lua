-- meter_start.lua: the start of a task of the worker under one meter rule
-- (TokenBucket or GCRA), and its undoing.
--
-- A meter used by the worker keeps two instants per key. The planned one is
-- the limiter's own state, which Allow and Reserve use: the capacity spoken
-- for, now or ahead for tasks that wait (booked with a ticket, see
-- common.lua; tasks that wait in a room use meter_claim.lua). The starts one
-- records when tasks actually start. A start is admitted when the task
-- holds a booking or the planned meter has room for it, and the starts
-- meter admits it within max_wait: the start is reserved there, at now +
-- wait. So starts stay spaced at the rate however late (or early) a task
-- with a booking arrives, and a late task starts in the gap it left
-- instead of waiting again.
--
-- KEYS[1]  the planned instant (see common.lua)
-- KEYS[2]  the starts instant, the same form
-- KEYS[3]  the key's block (see block.lua): no start comes while it holds,
--          whatever the task holds
-- KEYS[4]  by ticket: the ticket; or absent
-- KEYS[5]  by ticket: the generation of the key's tickets; or absent
-- ARGV[1]  mode: 0 start, 1 undo a start
-- ARGV[2]  n, units (1 <= n <= burst, checked by the caller)
-- ARGV[3]  burst
-- ARGV[4]  num } one unit is num/den microseconds of the rate, the fraction
-- ARGV[5]  den }   in lowest terms
-- ARGV[6]  where a booking is: 0 none, 1 a ticket
-- ARGV[7]  unused
-- start:   ARGV[8] the soonest the start may be, in ticks from now
--          ARGV[9] the longest the caller waits for its start, in ticks
--          ARGV[10] by ticket: the longest delay to book a slot ahead when
--            the task holds none and the meter has no room now, in ticks
--            (0: book nothing); otherwise: the longest the planned meter
--            may keep a task that holds nothing waiting, in ticks
--          ARGV[11] by ticket: the booking's grace (see common.lua), ticks
-- lane:    with a ticket, on one Redis server only (its keys are in the
--          task's queue's Cluster slot, not the key's): a task told to come
--          back (status 2 or 3) joins its queue's return lane here, to be
--          moved to the head of its queue a lead before its start (see the
--          worker's lane_poll.lua)
--          KEYS[6] the lane, KEYS[7] its holder
--          ARGV[12] the task's asynq ID, ARGV[13] the lead, us,
--          ARGV[14] the caller's dispatcher, holder if nobody is,
--          ARGV[15] the holder's lease, ms, ARGV[16] how long the lane
--          is kept past the task's move, ms
-- undo:    ARGV[8], ARGV[9] the planned end instant the start returned (us,
--            ticks; 0: none), ARGV[10], ARGV[11] the starts end instant
-- Returns  {status, wait_us, planned_end_us, planned_end_ticks,
--          starts_end_us, starts_end_ticks, now_us}
--          status 1: admitted, to start after wait_us; the ends (planned
--            0, 0 for a task that held capacity) are what undo needs
--          statuses 2 and 3 with a lane: two more values, the lane's
--            holder and when its lease ends (us)
--          status 0: the task holds no capacity, and the planned meter has
--            none within the caller's wait: wait_us is when it would have
--          status 2: the starts meter admits the start only after wait_us,
--            longer than the caller waits
--          status 3: booked (ARGV[10]): the task's slot comes after wait_us,
--            longer than the caller waits; it holds it by its ticket
--          status 4: not booked: a slot would come only after wait_us more
--            than the longest delay to book
--          undo: status 1 when anything was given back

local mode, n = tonumber(ARGV[1]), tonumber(ARGV[2])
local burst, per_unit, den = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local source = tonumber(ARGV[6])
local now = server_now()
local tolerance = burst * per_unit
local cost = n * per_unit
-- Every key's value read ahead, in one call (see common.lua).
local read = redis.call('MGET', unpack(KEYS, 1, math.min(#KEYS, 5)))
local planned_debt = ticks_until(KEYS[1], now, per_unit, den, read[1])
local starts_debt = ticks_until(KEYS[2], now, per_unit, den, read[2])

if mode == 1 then
  local back = 0
  local planned_end = tonumber(ARGV[8])
  if planned_end > 0 then
    back = back + cancel(KEYS[1], nil, now, planned_debt, cost, tolerance, per_unit, den, planned_end, tonumber(ARGV[9]))[1]
  end
  back = back + cancel(KEYS[2], nil, now, starts_debt, cost, tolerance, per_unit, den, tonumber(ARGV[10]), tonumber(ARGV[11]))[1]
  return {math.min(back, 1), 0, 0, 0, 0, 0, now}
end

local not_before, max_wait = tonumber(ARGV[8]), tonumber(ARGV[9])

-- come_back tells a task to come back after wait ticks (status 2 or 3): in its
-- queue's return lane, when the caller gave one.
local function come_back(status, wait)
  local wait_us = ceil_div(wait, den)
  if not KEYS[6] then
    return {status, wait_us, 0, 0, 0, 0, now}
  end
  local at_ms = floor_div(now + wait_us - tonumber(ARGV[13]), 1000)
  local keep_ms = at_ms - floor_div(now, 1000) + tonumber(ARGV[16])
  local holder, till = join_lane(KEYS[6], KEYS[7], ARGV[12], at_ms, ARGV[14], tonumber(ARGV[15]), keep_ms, now)
  return {status, wait_us, 0, 0, 0, 0, now, holder, till}
end

-- Does the task hold planned capacity already? A ticket counts while its
-- generation is the key's current one (Reset forgets them all) and its
-- grace has not run out.
local held = false
if source == 1 then
  local ticket = load_state(KEYS[4], read[4])
  local generation = tonumber(read[5])
  if ticket and ticket[4] == generation then
    local wait = (ticket[1] - now) * den + ticket[2] - tolerance
    held = wait + (ticket[3] or 0) >= 0
  end
end

if not held and planned_debt + cost > tolerance then
  local room_in = planned_debt + cost - tolerance -- ticks until the meter has room
  local ahead = tonumber(ARGV[10]) or 0
  if source == 1 and ahead > 0 then
    -- Book the task's slot ahead, by its ticket; start at it when the
    -- caller waits that long, or else tell it when to come back.
    if room_in > ahead then
      return {4, ceil_div(room_in - ahead, den), 0, 0, 0, 0, now}
    end
    local booking = reserve(KEYS[1], KEYS[4], KEYS[5], now, planned_debt, cost, tolerance, per_unit, den,
      ahead, tonumber(ARGV[11]), 0, {read[5], read[4]})
    local slot = booking[3] * den
    if slot > max_wait then
      return come_back(3, slot)
    end
    held = true
    not_before = math.max(not_before, slot)
  elseif room_in > math.min(max_wait, ahead) then
    return {0, ceil_div(room_in, den), 0, 0, 0, 0, now}
  else
    -- Room soon enough: the unit is taken now, to start when it conforms.
    not_before = math.max(not_before, room_in)
  end
end

-- The start comes when the starts meter admits the units, and no sooner
-- than not_before, nor while the key is blocked; it moves the meter's
-- instant as a unit started then would (a start on a meter with room keeps
-- the rest of its burst).
local wait = math.max(starts_debt + cost - tolerance, not_before, blocked_for(KEYS[3], now, read[3]) * den, 0)
if wait > max_wait then
  return come_back(2, wait)
end

local planned_us, planned_ticks = 0, 0
if not held then
  planned_debt = planned_debt + cost
  store_instant(KEYS[1], now, planned_debt, per_unit, den)
  planned_us, planned_ticks = instant_after(now, planned_debt, den)
end
starts_debt = math.max(starts_debt, wait) + cost
store_instant(KEYS[2], now, starts_debt, per_unit, den)
local starts_us, starts_ticks = instant_after(now, starts_debt, den)
return {1, ceil_div(wait, den), planned_us, planned_ticks, starts_us, starts_ticks, now}
