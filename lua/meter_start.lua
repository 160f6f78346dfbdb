-- meter_start.lua: the start of a task of the worker under one meter rule
-- (TokenBucket or GCRA), and its undoing.
--
-- A meter used by the worker keeps two instants per key. The planned one is
-- the limiter's own state, which Allow and Reserve use: the capacity spoken
-- for, now or ahead for tasks that wait (booked with a ticket, see
-- common.lua, or released from the key's waiting room, see room.lua). The
-- starts one records when tasks actually start. A start is admitted when
-- the task holds capacity of the planned meter (a booking, or a release) or
-- the planned meter has room for it now, and the starts meter admits it
-- within max_wait: the start is reserved there, at now + wait. So starts
-- stay spaced at the rate however late a task with a booking arrives, and
-- a late task starts in the gap it left instead of waiting again.
--
-- KEYS[1]  the planned instant (see common.lua)
-- KEYS[2]  the starts instant, the same form
-- KEYS[3]  booked by ticket: the ticket; by room: the room's waiters (see
--          room.lua); or absent
-- KEYS[4]  by ticket: the generation of the key's tickets; by room: the
--          room; or absent
-- ARGV[1]  mode: 0 start, 1 undo a start
-- ARGV[2]  n, units (1 <= n <= burst, checked by the caller)
-- ARGV[3]  burst
-- ARGV[4]  num } one unit is num/den microseconds of the rate, the fraction
-- ARGV[5]  den }   in lowest terms
-- ARGV[6]  where a booking is: 0 none, 1 a ticket, 2 the room
-- ARGV[7]  by room: the waiter's ID
-- ARGV[8]  start: the soonest the start may be, in ticks from now
--          undo: the planned end instant the start returned (us; 0: none)
-- ARGV[9]  start: the longest the caller waits for its start, in ticks
--          undo: the planned end's remainder, in ticks
-- ARGV[10] undo: the starts end instant the start returned (us)
-- ARGV[11] undo: its remainder, in ticks
-- ARGV[12] undo, by room: the release the start used, to put back ("" for
--          none)
-- Returns  {status, wait_us, planned_end_us, planned_end_ticks,
--          starts_end_us, starts_end_ticks, now_us, release}
--          status 1: admitted, to start after wait_us; the ends (planned
--            0, 0 for a task that held capacity) and the release used
--            ("" for none) are what undo needs
--          status 0: the task holds no capacity, and the planned meter has
--            none now, or (by room) others wait in the room: wait_us is
--            when the meter would have room (0 for the room's turn)
--          status 2: the starts meter admits the start only after wait_us,
--            longer than the caller waits
--          undo: status 1 when anything was given back

local mode, n = tonumber(ARGV[1]), tonumber(ARGV[2])
local burst, per_unit, den = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local source, waiter = tonumber(ARGV[6]), ARGV[7]
local now = server_now()
local tolerance = burst * per_unit
local cost = n * per_unit
local planned_debt = ticks_until(KEYS[1], now, den)
local starts_debt = ticks_until(KEYS[2], now, den)

if mode == 1 then
  local back = 0
  local planned_end = tonumber(ARGV[8])
  if planned_end > 0 then
    back = back + cancel(KEYS[1], nil, now, planned_debt, cost, tolerance, per_unit, den, planned_end, tonumber(ARGV[9]))[1]
  end
  back = back + cancel(KEYS[2], nil, now, starts_debt, cost, tolerance, per_unit, den, tonumber(ARGV[10]), tonumber(ARGV[11]))[1]
  if source == 2 and ARGV[12] ~= '' then
    redis.call('HSET', KEYS[3], waiter, ARGV[12])
  end
  return {math.min(back, 1), 0, 0, 0, 0, 0, now, ''}
end

local not_before, max_wait = tonumber(ARGV[8]), tonumber(ARGV[9])

-- Does the task hold planned capacity already?
local held = false
local release = ''
if source == 1 then
  -- A ticket counts while its generation is the key's current one (Reset
  -- forgets them all) and its grace has not run out.
  local ticket = load_state(KEYS[3])
  local generation = tonumber(redis.call('GET', KEYS[4]))
  if ticket and ticket[4] == generation then
    local wait = (ticket[1] - now) * den + ticket[2] - tolerance
    held = wait + (ticket[3] or 0) >= 0
  end
elseif source == 2 then
  local info = redis.call('HGET', KEYS[3], waiter)
  if info and string.sub(info, 1, 1) == '=' then
    held, release = true, info
  elseif info or redis.call('ZCARD', KEYS[4]) > 0 then
    -- Others wait for this key (or the task itself does): its turn comes
    -- from the room.
    return {0, 0, 0, 0, 0, 0, now, ''}
  end
end

if not held and planned_debt + cost > tolerance then
  return {0, ceil_div(planned_debt + cost - tolerance, den), 0, 0, 0, 0, now, ''}
end

-- The start comes when the starts meter admits the units, and no sooner
-- than not_before; it moves the meter's instant as a unit started then
-- would (a start on a meter with room keeps the rest of its burst).
local wait = math.max(starts_debt + cost - tolerance, not_before, 0)
if wait > max_wait then
  return {2, ceil_div(wait, den), 0, 0, 0, 0, now, ''}
end

local planned_us, planned_ticks = 0, 0
if not held then
  planned_debt = planned_debt + cost
  store_instant(KEYS[1], now, planned_debt, den)
  planned_us, planned_ticks = instant_after(now, planned_debt, den)
end
if release ~= '' then
  redis.call('HDEL', KEYS[3], waiter) -- used
end
starts_debt = math.max(starts_debt, wait) + cost
store_instant(KEYS[2], now, starts_debt, den)
local starts_us, starts_ticks = instant_after(now, starts_debt, den)
return {1, ceil_div(wait, den), planned_us, planned_ticks, starts_us, starts_ticks, now, release}
