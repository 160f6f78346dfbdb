-- gcra.lua: the generic cell rate algorithm (virtual scheduling). One
-- number per key: the theoretical arrival time (TAT) of the next request.
--
-- KEYS[1]  the TAT, "<us>" or "<us>:<ticks>" (ticks of 1/den us past that
--          microsecond); absent means no debt
-- KEYS[2]  the key's block (see block.lua): while it holds, nothing is
--          admitted, and the first unit after it is admitted when it ends
-- KEYS[3]  reserve and cancel, optional: the caller's ticket (see common.lua)
-- ARGV[1]  mode: 0 take n units, 1 peek (test for n units, write nothing),
--          2 reserve n units, 3 cancel a reservation of n units
-- ARGV[2]  n, units requested (1 <= n <= burst, checked by the caller)
-- ARGV[3]  burst, how many units may arrive back to back
-- ARGV[4]  num } the emission interval T is num/den microseconds, the
-- ARGV[5]  den }   fraction in lowest terms
-- ARGV[6]  reserve: the longest wait to book, in ticks;
--          cancel: the reservation's end instant, in microseconds
-- ARGV[7]  reserve: how long after its slot's start a new ticketed booking
--          may still be claimed, in ticks; cancel: the end instant's
--          remainder, in ticks
-- ARGV[8]  reserve: the soonest a new booking may start, in ticks from now
-- Returns  {allowed (0|1), remaining, retry_after_us, reset_after_us, now_us}
--          where a booked reservation's retry_after_us is its start delay
--          and three more values follow: its end instant (us, ticks) and 1
--          when it is the ticket's standing booking, else 0
--
-- Time is counted in ticks of 1/den microsecond, so T is exactly num ticks.
-- A request of n units conforms when max(TAT, now) + n*T - burst*T <= now;
-- it then moves the TAT to max(TAT, now) + n*T. A reservation may move the
-- TAT further, and waits until its units conform.

local mode, n, burst, T, den, arg6, arg7, arg8 = numeric_argv()

local now = server_now()
-- debt: how far the TAT lies ahead of now, in ticks (0 when it has passed)
local debt = ticks_until(KEYS[1], now, den)
local tolerance = burst * T
local cost = n * T
local blocked = blocked_for(KEYS[2], now)
if blocked > 0 and mode ~= MODE_CANCEL then
  -- as if the TAT stood where one unit conforms exactly when the block ends
  debt = math.max(debt, blocked * den + tolerance - T)
end

if mode == MODE_RESERVE then
  return reserve(KEYS[1], KEYS[3], now, debt, cost, tolerance, T, den, arg6, arg7, arg8)
elseif mode == MODE_CANCEL then
  return cancel(KEYS[1], KEYS[3], now, debt, cost, tolerance, T, den, arg6, arg7)
end

local new_debt = debt + cost
if new_debt > tolerance then
  -- allow_at = TAT + n*T - burst*T; wait for it
  return meter_reply(0, debt, tolerance, T, new_debt - tolerance, den, now)
end
if mode == MODE_TAKE then
  debt = new_debt
  store_instant(KEYS[1], now, debt, den)
end
return meter_reply(1, debt, tolerance, T, 0, den, now)
