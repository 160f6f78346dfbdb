-- meter.lua: the decisions of TokenBucket and GCRA, one script for both.
-- Each keeps one instant per key: GCRA's theoretical arrival time of the
-- next unit, and the instant a token bucket is full again. They are the same
-- number: how far the instant lies ahead of now (the "debt") is the refill
-- the bucket still owes, and GCRA's tolerance burst*T is the bucket's
-- capacity. The two policies take the same decisions at the same rate and
-- burst; they stay two names because users know both.
--
-- KEYS[1]  the instant, as common.lua's Instants describe; absent means a
--          full bucket, no debt
-- ARGV[1]  mode: 0 take n units, 1 peek (test for n units, write nothing);
--          reservations and blocks go to meter_booking.lua
-- ARGV[2]  n, units requested (1 <= n <= burst, checked by the caller)
-- ARGV[3]  burst, how many units may arrive back to back (the bucket's
--          capacity in tokens)
-- ARGV[4]  num } one unit is num/den microseconds of the rate (GCRA's
-- ARGV[5]  den }   emission interval T, a token's refill), in lowest terms
-- Returns  {allowed (0|1), remaining, retry_after_us, reset_after_us, now_us};
--          the waits are exact also for an instant another policy stored
--
-- Time is counted in ticks of 1/den microsecond, so a unit is exactly num
-- ticks and nothing is rounded. A request of n units conforms when
-- debt + n*num <= burst*num (for GCRA: max(TAT, now) + n*T - burst*T <=
-- now; for the bucket: n tokens are present); taking them moves the instant
-- n*num ticks further. (A reservation may move it further still, see
-- meter_booking.lua.)

-- The decision path calls only the two helpers that read and write the
-- instant (and what they call): Redis runs the whole script on every call,
-- and each helper it defines is a closure made each time. Integer division
-- is exact here for the reasons common.lua's floor_div gives.

local mode, n = tonumber(ARGV[1]), tonumber(ARGV[2])
local burst, num, den = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])

local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])
local ticks, stored, onum, oden = signed_ticks(KEYS[1], now, num, den)
local debt = math.max(0, ticks or 0)
local tolerance = burst * num
local new_debt = debt + n * num

if new_debt > tolerance or mode == MODE_PEEK then
  -- Nothing is written: the waits are those of the instant as stored. One
  -- measured by another policy (a named limiter's policy changed) moves at
  -- that policy's pace until a decision writes it, so its waits are
  -- counted in its own ticks: n units conform once stored <= (burst-n)*onum,
  -- the bound its conversion (rounded up) meets exactly then.
  local retry, reset, per_us = new_debt - tolerance, debt, den
  if onum and (onum ~= num or oden ~= den) then
    retry, reset, per_us = stored - (burst - n) * onum, math.max(0, stored), oden
  end
  local allowed = 0
  if new_debt <= tolerance then
    allowed, retry = 1, 0
  end
  return {allowed, math.max(0, math.floor((tolerance - debt) / num)), math.ceil(retry / per_us), math.ceil(reset / per_us), now}
end
debt = new_debt
store_instant(KEYS[1], now, debt, num, den)
return {1, math.floor((tolerance - debt) / num), 0, math.ceil(debt / den), now}
