-- token_bucket.lua: a bucket of burst tokens, refilled continuously at the
-- rate; a request takes n tokens or is rejected whole.
--
-- KEYS[1]  the instant the bucket is full again, "<us>" or "<us>:<ticks>"
--          (ticks of 1/den us past that microsecond); absent means full
-- KEYS[2]  the key's block (see block.lua): while it holds, nothing is
--          admitted, and the first unit after it is admitted when it ends
-- KEYS[3]  reserve and cancel, optional: the caller's ticket (see common.lua)
-- ARGV[1]  mode: 0 take n tokens, 1 peek (test for n tokens, write nothing),
--          2 reserve n tokens, 3 cancel a reservation of n tokens
-- ARGV[2]  n, tokens requested (1 <= n <= burst, checked by the caller)
-- ARGV[3]  burst, the bucket's capacity in tokens
-- ARGV[4]  num } one token refills every num/den microseconds, the fraction
-- ARGV[5]  den }   in lowest terms
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
-- Time is counted in ticks of 1/den microsecond, so one token is exactly num
-- ticks of refill and nothing is rounded. Storing the refill deadline instead
-- of (tokens, last refill) keeps the state one integer: the tokens present
-- are burst - missing / num, where missing is the refill time still owed. A
-- reservation takes tokens the bucket does not have yet: the bucket goes
-- into debt, and the reservation starts when the refill has paid for it.

local mode, n, burst, num, den, arg6, arg7, arg8 = numeric_argv()

local now = server_now()
local missing = ticks_until(KEYS[1], now, den) -- refill owed until full
local capacity = burst * num
local cost = n * num
local blocked = blocked_for(KEYS[2], now)
if blocked > 0 and mode ~= MODE_CANCEL then
  -- as if the bucket refilled only one token by the time the block ends
  missing = math.max(missing, blocked * den + capacity - num)
end

if mode == MODE_RESERVE then
  return reserve(KEYS[1], KEYS[3], now, missing, cost, capacity, num, den, arg6, arg7, arg8)
elseif mode == MODE_CANCEL then
  return cancel(KEYS[1], KEYS[3], now, missing, cost, capacity, num, den, arg6, arg7)
end

local tokens = capacity - missing -- the tokens present, in ticks
if cost > tokens then
  return meter_reply(0, missing, capacity, num, cost - tokens, den, now)
end
if mode == MODE_TAKE then
  missing = missing + cost
  store_instant(KEYS[1], now, missing, den)
end
return meter_reply(1, missing, capacity, num, 0, den, now)
