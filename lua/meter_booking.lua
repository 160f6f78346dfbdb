-- meter_booking.lua: reservations and blocks for the two meters that keep
-- one instant per key, TokenBucket (the instant the bucket is full again)
-- and GCRA (the theoretical arrival time): the same arithmetic serves both.
-- Decisions, the hot path, stay in meter.lua, which defines none of these
-- helpers.
--
-- KEYS[1]  the meter's instant, as common.lua's Instants describe
-- KEYS[2]  reserve and cancel: the caller's ticket, optional (see
--          common.lua); block: the key's block, written for block.lua's
--          queries (a block moves the instant, so decisions need not read
--          it)
-- KEYS[3]  reserve with a ticket: the generation of the key's tickets (see
--          common.lua)
-- KEYS[4]  reserve at an instant (ARGV[9]): the starts instant of the key
--          (see meter_start.lua), which the booking comes after too
-- ARGV[1]  mode: 2 reserve n units, 3 cancel a reservation of n units,
--          4 block the key
-- ARGV[2]  n, units (1 <= n <= burst, checked by the caller)
-- ARGV[3]  burst, the meter's capacity in units
-- ARGV[4]  num } one unit is num/den microseconds of the rate, the fraction
-- ARGV[5]  den }   in lowest terms
-- ARGV[6]  reserve: the longest wait to book, in ticks; cancel: the
--          reservation's end instant, in microseconds; block: how long, in
--          microseconds
-- ARGV[7]  reserve: how long after its slot's start a new ticketed booking
--          may still be claimed, in ticks; cancel: the end instant's
--          remainder, in ticks
-- ARGV[8]  reserve: the soonest a new booking may start, in ticks from now
-- ARGV[9]  reserve: the soonest a new booking may start, as a Unix instant
--          in us (0: none); the longest wait (ARGV[6]) then counts from it,
--          and the ticket's booking for another instant is given back
-- Returns  {allowed (0|1), remaining, retry_after_us, reset_after_us, now_us}
--          where a booked reservation's retry_after_us is its start delay
--          and three more values follow: its end instant (us, ticks) and 1
--          when it is the ticket's standing booking, else 0; a block's
--          retry_after_us is how long it holds

local mode, n = tonumber(ARGV[1]), tonumber(ARGV[2])
local burst, per_unit, den = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])

local now = server_now()
-- debt: how far the instant lies ahead of now, in ticks (0 when passed)
local debt = ticks_until(KEYS[1], now, per_unit, den)
local tolerance = burst * per_unit
local cost = n * per_unit

if mode == MODE_RESERVE then
  local max_wait, not_before = tonumber(ARGV[6]), tonumber(ARGV[8])
  local at = tonumber(ARGV[9]) or 0
  if at > 0 then
    -- The ticket's standing booking for another instant (its task waited
    -- again since) is given back first: the booking is at the instant.
    return book_at({KEYS[1], KEYS[2], KEYS[3], KEYS[4]}, now, n, burst, per_unit, den, max_wait, tonumber(ARGV[7]), at)
  end
  return reserve(KEYS[1], KEYS[2], KEYS[3], now, debt, cost, tolerance, per_unit, den,
    max_wait, tonumber(ARGV[7]), not_before)
elseif mode == MODE_CANCEL then
  return cancel(KEYS[1], KEYS[2], now, debt, cost, tolerance, per_unit, den, tonumber(ARGV[6]), tonumber(ARGV[7]))
elseif mode == MODE_BLOCK then
  return block(KEYS[1], KEYS[2], now, debt, tolerance, per_unit, den, tonumber(ARGV[6]))
end
return redis.error_reply('meter_booking.lua: unknown mode ' .. tostring(ARGV[1]))
