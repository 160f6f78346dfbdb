-- sliding_window.lua: sliding window counter, the two-counter approximation.
-- The previous window's count is weighted by how much of it still overlaps
-- the sliding window: estimate = prev * (window - elapsed) / window + cur.
--
-- KEYS[1]  state "<window index>:<previous count>:<current count>", and
--          ":<window us>" for a named limiter (see common.lua's changeable). Counted under another window length (a policy changed),
--          the old estimate of the units in the sliding window carries over
--          into the current window.
-- KEYS[2]  the key's block (see block.lua): while it holds, nothing is
--          admitted
-- ARGV[1]  mode: 0 take n units, 1 peek (test for n units, write nothing),
--          2 take n units and say how to undo it, 3 undo a take
-- ARGV[2]  n, units requested (1 <= n <= limit, checked by the caller)
-- ARGV[3]  limit, units per window
-- ARGV[4]  window length in microseconds, a whole number of weight units
-- ARGV[5]  weight unit in microseconds (1000 when the window is whole
--          milliseconds, else 1): the resolution of the weight
-- ARGV[6]  undo: the window index the units were taken in
-- Returns  {allowed (0|1), remaining, retry_after_us, reset_after_us, now_us}
--          and, for mode 2, the window index and 0 (what undo needs)
--
-- Comparisons are made in integers scaled by the window (in weight units):
-- admit when prev * (W - e) + (cur + n) * W <= limit * W, elapsed e rounded
-- down to a whole unit, which counts the previous window a little longer.

local mode = tonumber(ARGV[1])
local n = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
local window = tonumber(ARGV[4])
local unit = tonumber(ARGV[5])
local taken_in = tonumber(ARGV[6])
local W = window / unit

local now = server_now()
local measured = changeable(KEYS[1]) and window or nil -- see common.lua
local index = floor_div(now, window)
local prev, cur = 0, 0
local read = redis.call('MGET', KEYS[1], KEYS[2]) -- the state and the block, read ahead (see common.lua)
local state = load_state(KEYS[1], read[1])
-- old is a state counted under another window length, while it carries
local old
if state and state[4] and state[4] ~= window then
  -- what the old window's policy would count now, rounded up, becomes the
  -- current window's count
  local ow = state[4]
  local ostart = state[1] * ow
  local carried = 0
  if now < ostart + ow then
    carried = state[3] + math.ceil(state[2] * (ow - (now - ostart)) / ow)
  elseif now < ostart + 2 * ow then
    carried = math.ceil(state[3] * (ow - (now - ostart - ow)) / ow)
  end
  old = state
  state = nil
  if carried > 0 then
    state = {index, 0, carried}
  end
end

-- carried_fits returns the first instant from now at which the count
-- carried from old is at most room: nothing is written until then, so the
-- old estimate keeps decaying over the old window (room >= 0). While the
-- old window lasts, the count is cur + ceil(prev * (ow - x) / ow), x into
-- it; then ceil(cur * (ow - y) / ow), y into the next; then nothing.
local function carried_fits(room)
  local ow, prev_old, cur_old = old[4], old[2], old[3]
  local ostart = old[1] * ow
  if now < ostart + ow and cur_old <= room then
    local x = 0
    if prev_old > 0 then
      x = ow - floor_div((room - cur_old) * ow, prev_old)
    end
    if x < ow then
      return math.max(now, ostart + math.max(0, x))
    end
  end
  local y = 0
  if cur_old > 0 then
    y = math.min(ow, math.max(0, ow - floor_div(room * ow, cur_old)))
  end
  return math.max(now, ostart + ow + y)
end
if state then
  if state[1] >= index then
    -- same window, or the clock stepped back: keep counting in it
    index, prev, cur = state[1], state[2], state[3]
  elseif state[1] == index - 1 then
    prev = state[3]
  end
end
local start = index * window

if mode == MODE_CANCEL then
  -- The units count where they were taken: in the stored current window,
  -- or in the stored previous one once a later take moved the window on.
  if state and (state[1] + 2) * window > now then
    local w, p, c = state[1], state[2], state[3]
    if w == taken_in then
      c = math.max(0, c - n)
    elseif w == taken_in + 1 then
      p = math.max(0, p - n)
    end
    store_state(KEYS[1], (w + 2) * window - now, w, p, c, measured)
  end
  return {1, 0, 0, 0, now}
end

local elapsed = math.max(0, floor_div(now - start, unit))

-- weighted_prev is ceil(prev * (W - e) / W): the previous window's share.
local function weighted_prev(e)
  return ceil_div(prev * (W - e), W)
end

local blocked = blocked_for(KEYS[2], now, read[2])
if blocked > 0 then
  return {0, 0, blocked, blocked, now}
end

if prev * (W - elapsed) + (cur + n) * W > limit * W then
  local wait_until
  local room = limit - n - cur
  if room >= 0 then
    -- Later in this window: prev * (W - e) <= room * W.
    wait_until = start + (W - floor_div(room * W, prev)) * unit
  else
    -- In the next window the current count becomes the previous one:
    -- cur * (W - e) <= (limit - n) * W.
    local e = math.max(0, W - floor_div((limit - n) * W, cur))
    wait_until = start + window + e * unit
  end
  local reset_after = start + 2 * window - now
  if cur == 0 then
    reset_after = start + window - now
  end
  if old then
    -- nothing is written: the count carried over from the old window
    -- length keeps decaying, and alone it counts (prev is 0)
    wait_until, reset_after = carried_fits(limit - n), carried_fits(0) - now
  end
  return {0, math.max(0, limit - cur - weighted_prev(elapsed)), wait_until - now, reset_after, now}
end

if mode ~= MODE_PEEK then
  cur = cur + n
  store_state(KEYS[1], start + 2 * window - now, index, prev, cur, measured)
end
local reset_after = 0
if cur > 0 then
  reset_after = start + 2 * window - now
elseif prev > 0 then
  reset_after = start + window - now
end
return {1, math.max(0, limit - cur - weighted_prev(elapsed)), 0, reset_after, now, index, 0}
