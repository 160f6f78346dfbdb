-- gcra.lua: the generic cell rate algorithm (virtual scheduling). One
-- number per key: the theoretical arrival time (TAT) of the next request.
--
-- KEYS[1]  the TAT, "<us>" or "<us>:<ticks>" (ticks of 1/den us past that
--          microsecond); absent means no debt
-- ARGV[1]  mode: 0 take n units, 1 peek (test for n units, write nothing);
--          reservations and blocks go to meter_booking.lua
-- ARGV[2]  n, units requested (1 <= n <= burst, checked by the caller)
-- ARGV[3]  burst, how many units may arrive back to back
-- ARGV[4]  num } the emission interval T is num/den microseconds, the
-- ARGV[5]  den }   fraction in lowest terms
-- Returns  {allowed (0|1), remaining, retry_after_us, reset_after_us, now_us}
--
-- Time is counted in ticks of 1/den microsecond, so T is exactly num ticks.
-- A request of n units conforms when max(TAT, now) + n*T - burst*T <= now;
-- it then moves the TAT to max(TAT, now) + n*T. (A reservation may move the
-- TAT further, see meter_booking.lua.)

-- The decision path is written out in full, without the helpers of
-- common.lua: Redis runs the whole script on every call, and each helper it
-- defines is a closure made each time (about 1 us of server time per call
-- for this script, measured). Integer division is exact here for the
-- reasons common.lua's floor_div gives.

local mode, n = tonumber(ARGV[1]), tonumber(ARGV[2])
local burst, T, den = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])

local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])

-- debt: how far the TAT lies ahead of now, in ticks (0 when it has passed)
local debt = 0
local stored = redis.call('GET', KEYS[1])
if stored then
  -- "<us>", "<us>:<ticks>" or "<us>:<ticks>:<num>:<den>": see common.lua's
  -- Instants; measured with another interval, the units carry over
  local f1 = (string.find(stored, ':', 1, true))
  local tat, ticks, onum, oden = tonumber(stored), 0, T, den
  if f1 then
    tat = tonumber(string.sub(stored, 1, f1 - 1))
    local f2 = (string.find(stored, ':', f1 + 1, true))
    if f2 then
      local f3 = (string.find(stored, ':', f2 + 1, true))
      ticks = tonumber(string.sub(stored, f1 + 1, f2 - 1))
      onum, oden = tonumber(string.sub(stored, f2 + 1, f3 - 1)), tonumber(string.sub(stored, f3 + 1))
    else
      ticks = tonumber(string.sub(stored, f1 + 1))
    end
  end
  if tat >= now then
    debt = (tat - now) * oden + ticks
    if onum ~= T or oden ~= den then
      debt = math.min(math.ceil(debt * T / onum), 4503599627370496)
    end
  end
end
local tolerance = burst * T
local new_debt = debt + n * T

if new_debt > tolerance then
  -- allow_at = TAT + n*T - burst*T; wait for it
  return {0, math.max(0, math.floor((tolerance - debt) / T)), math.ceil((new_debt - tolerance) / den), math.ceil(debt / den), now}
end
if mode == 0 then -- take: the TAT moves to now + new_debt
  debt = new_debt
  local whole = math.floor(debt / den)
  local value = string.format('%d', now + whole)
  local brace = string.find(KEYS[1], '{', 1, true) or (#KEYS[1] + 1)
  local named = string.find(KEYS[1], '@', 1, true)
  if named and named < brace then
    -- a named limiter: the interval too (see common.lua's Instants)
    value = string.format('%d:%d:%d:%d', now + whole, debt - whole * den, T, den)
  elseif debt > whole * den then
    value = value .. ':' .. string.format('%d', debt - whole * den)
  end
  redis.call('SET', KEYS[1], value, 'PX', string.format('%d', math.max(1, math.ceil(debt / den / 1000))))
end
return {1, math.floor((tolerance - debt) / T), 0, math.ceil(debt / den), now}
