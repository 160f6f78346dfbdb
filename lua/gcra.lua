-- gcra.lua: the generic cell rate algorithm (virtual scheduling). One
-- number per key: the theoretical arrival time (TAT) of the next request.
--
-- KEYS[1]  the TAT, "<us>" or "<us>:<ticks>" (ticks of 1/den us past that
--          microsecond); absent means no debt
-- ARGV[1]  mode: 0 take n units, 1 peek (test for n units, write nothing)
-- ARGV[2]  n, units requested (1 <= n <= burst, checked by the caller)
-- ARGV[3]  burst, how many units may arrive back to back
-- ARGV[4]  num } the emission interval T is num/den microseconds, the
-- ARGV[5]  den }   fraction in lowest terms
-- Returns  {allowed (0|1), remaining, retry_after_us, reset_after_us, now_us}
--
-- Time is counted in ticks of 1/den microsecond, so T is exactly num ticks.
-- A request of n units conforms when max(TAT, now) + n*T - burst*T <= now;
-- it then moves the TAT to max(TAT, now) + n*T.

local mode, n, burst, T, den = numeric_argv()

local now = server_now()
-- debt: how far the TAT lies ahead of now, in ticks (0 when it has passed)
local debt = ticks_until(KEYS[1], now, den)
local tolerance = burst * T
local new_debt = debt + n * T

if new_debt > tolerance then
  -- allow_at = TAT + n*T - burst*T; wait for it
  return {0, floor_div(tolerance - debt, T), ceil_div(new_debt - tolerance, den), ceil_div(debt, den), now}
end
if mode == MODE_TAKE then
  debt = new_debt
  store_instant(KEYS[1], now, debt, den)
end
return {1, floor_div(tolerance - debt, T), 0, ceil_div(debt, den), now}
