-- token_bucket.lua: a bucket of burst tokens, refilled continuously at the
-- rate; a request takes n tokens or is rejected whole.
--
-- KEYS[1]  the instant the bucket is full again, "<us>" or "<us>:<ticks>"
--          (ticks of 1/den us past that microsecond); absent means full
-- ARGV[1]  mode: 0 take n tokens, 1 peek (test for n tokens, write nothing)
-- ARGV[2]  n, tokens requested (1 <= n <= burst, checked by the caller)
-- ARGV[3]  burst, the bucket's capacity in tokens
-- ARGV[4]  num } one token refills every num/den microseconds, the fraction
-- ARGV[5]  den }   in lowest terms
-- Returns  {allowed (0|1), remaining, retry_after_us, reset_after_us, now_us}
--
-- Time is counted in ticks of 1/den microsecond, so one token is exactly num
-- ticks of refill and nothing is rounded. Storing the refill deadline instead
-- of (tokens, last refill) keeps the state one integer: the tokens present
-- are burst - missing / num, where missing is the refill time still owed.

local mode = tonumber(ARGV[1])
local n = tonumber(ARGV[2])
local burst = tonumber(ARGV[3])
local num = tonumber(ARGV[4])
local den = tonumber(ARGV[5])

local now = server_now()
local missing = 0 -- ticks of refill until the bucket is full
local state = load_state(KEYS[1])
if state and state[1] >= now then
  missing = (state[1] - now) * den + (state[2] or 0)
end
local tokens = burst * num - missing -- the tokens present, in ticks
local cost = n * num

if cost > tokens then
  return {0, floor_div(tokens, num), ceil_div(cost - tokens, den), ceil_div(missing, den), now}
end
if mode == MODE_TAKE then
  tokens = tokens - cost
  missing = missing + cost
  local whole = floor_div(missing, den)
  local ticks = missing - whole * den
  if ticks > 0 then
    store_state(KEYS[1], ceil_div(missing, den), now + whole, ticks)
  else
    store_state(KEYS[1], whole, now + whole)
  end
end
return {1, floor_div(tokens, num), 0, ceil_div(missing, den), now}
