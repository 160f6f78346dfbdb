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

local mode = tonumber(ARGV[1])
local n = tonumber(ARGV[2])
local burst = tonumber(ARGV[3])
local T = tonumber(ARGV[4])
local den = tonumber(ARGV[5])

local now = server_now()
-- debt: how far the TAT lies ahead of now, in ticks (0 when it has passed)
local debt = 0
local state = load_state(KEYS[1])
if state and state[1] >= now then
  debt = (state[1] - now) * den + (state[2] or 0)
end
local tolerance = burst * T
local new_debt = debt + n * T

if new_debt > tolerance then
  -- allow_at = TAT + n*T - burst*T; wait for it
  return {0, floor_div(tolerance - debt, T), ceil_div(new_debt - tolerance, den), ceil_div(debt, den), now}
end
if mode == MODE_TAKE then
  debt = new_debt
  local whole = floor_div(debt, den)
  local ticks = debt - whole * den
  if ticks > 0 then
    store_state(KEYS[1], ceil_div(debt, den), now + whole, ticks)
  else
    store_state(KEYS[1], whole, now + whole)
  end
end
return {1, floor_div(tolerance - debt, T), 0, ceil_div(debt, den), now}
