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

local mode, n, burst, num, den = numeric_argv()

local now = server_now()
local missing = ticks_until(KEYS[1], now, den) -- refill owed until full
local tokens = burst * num - missing -- the tokens present, in ticks
local cost = n * num

if cost > tokens then
  return {0, floor_div(tokens, num), ceil_div(cost - tokens, den), ceil_div(missing, den), now}
end
if mode == MODE_TAKE then
  tokens = tokens - cost
  missing = missing + cost
  store_instant(KEYS[1], now, missing, den)
end
return {1, floor_div(tokens, num), 0, ceil_div(missing, den), now}
