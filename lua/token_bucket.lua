-- token_bucket.lua: a bucket of burst tokens, refilled continuously at the
-- rate; a request takes n tokens or is rejected whole.
--
-- KEYS[1]  the instant the bucket is full again, "<us>" or "<us>:<ticks>"
--          (ticks of 1/den us past that microsecond); absent means full
-- ARGV[1]  mode: 0 take n tokens, 1 peek (test for n tokens, write nothing);
--          reservations and blocks go to meter_booking.lua
-- ARGV[2]  n, tokens requested (1 <= n <= burst, checked by the caller)
-- ARGV[3]  burst, the bucket's capacity in tokens
-- ARGV[4]  num } one token refills every num/den microseconds, the fraction
-- ARGV[5]  den }   in lowest terms
-- Returns  {allowed (0|1), remaining, retry_after_us, reset_after_us, now_us}
--
-- Time is counted in ticks of 1/den microsecond, so one token is exactly num
-- ticks of refill and nothing is rounded. Storing the refill deadline instead
-- of (tokens, last refill) keeps the state one integer: the tokens present
-- are burst - missing / num, where missing is the refill time still owed. (A
-- reservation takes tokens the bucket does not have yet, see
-- meter_booking.lua: the bucket goes into debt.)

-- The decision path is written out in full, without the helpers of
-- common.lua: Redis runs the whole script on every call, and each helper it
-- defines is a closure made each time. Integer division is exact here for
-- the reasons common.lua's floor_div gives.

local mode, n = tonumber(ARGV[1]), tonumber(ARGV[2])
local burst, num, den = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])

local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])

-- missing: the refill owed until the bucket is full, in ticks
local missing = 0
local stored = redis.call('GET', KEYS[1])
if stored then
  -- "<us>", "<us>:<ticks>" or "<us>:<ticks>:<num>:<den>": see common.lua's
  -- Instants; measured with another interval, the units carry over
  local f1 = (string.find(stored, ':', 1, true))
  local full_at, ticks, onum, oden = tonumber(stored), 0, num, den
  if f1 then
    full_at = tonumber(string.sub(stored, 1, f1 - 1))
    local f2 = (string.find(stored, ':', f1 + 1, true))
    if f2 then
      local f3 = (string.find(stored, ':', f2 + 1, true))
      ticks = tonumber(string.sub(stored, f1 + 1, f2 - 1))
      onum, oden = tonumber(string.sub(stored, f2 + 1, f3 - 1)), tonumber(string.sub(stored, f3 + 1))
    else
      ticks = tonumber(string.sub(stored, f1 + 1))
    end
  end
  if full_at >= now then
    missing = (full_at - now) * oden + ticks
    if onum ~= num or oden ~= den then
      missing = math.min(math.ceil(missing * num / onum), 4503599627370496)
    end
  end
end
local tokens = burst * num - missing -- the tokens present, in ticks
local cost = n * num

if cost > tokens then
  return {0, math.max(0, math.floor(tokens / num)), math.ceil((cost - tokens) / den), math.ceil(missing / den), now}
end
if mode == 0 then -- take: the bucket is full again missing ticks later
  tokens = tokens - cost
  missing = missing + cost
  local whole = math.floor(missing / den)
  local value = string.format('%d', now + whole)
  local brace = string.find(KEYS[1], '{', 1, true) or (#KEYS[1] + 1)
  local named = string.find(KEYS[1], '@', 1, true)
  if named and named < brace then
    -- a named limiter: the interval too (see common.lua's Instants)
    value = string.format('%d:%d:%d:%d', now + whole, missing - whole * den, num, den)
  elseif missing > whole * den then
    value = value .. ':' .. string.format('%d', missing - whole * den)
  end
  redis.call('SET', KEYS[1], value, 'PX', string.format('%d', math.max(1, math.ceil(missing / den / 1000))))
end
return {1, math.floor(tokens / num), 0, math.ceil(missing / den), now}
