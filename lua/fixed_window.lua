-- fixed_window.lua: at most limit units per window, windows aligned to the
-- Unix epoch (a 1-minute window resets at every whole minute).
--
-- KEYS[1]  state "<window index>:<count>", and ":<window us>" for a named
--          limiter (see common.lua's changeable); absent means nothing
--          counted. Counted under another window length (a policy changed),
--          the count carries over into the current window while the window
--          it was counted in lasts.
-- KEYS[2]  the key's block (see block.lua): while it holds, nothing is
--          admitted
-- ARGV[1]  mode: 0 take n units, 1 peek (test for n units, write nothing),
--          2 take n units and say how to undo it, 3 undo a take
-- ARGV[2]  n, units requested (1 <= n <= limit, checked by the caller)
-- ARGV[3]  limit, units per window
-- ARGV[4]  window length in microseconds
-- ARGV[5]  undo: the window index the units were taken in
-- Returns  {allowed (0|1), remaining, retry_after_us, reset_after_us, now_us}
--          and, for mode 2, the window index and 0 (what undo needs)
--
-- A rejected request writes nothing. Two bursts either side of a boundary can
-- admit 2 x limit within one window's length: the price of O(1) state.

local mode = tonumber(ARGV[1])
local n = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
local window = tonumber(ARGV[4])
local taken_in = tonumber(ARGV[5])

local now = server_now()
local measured = changeable(KEYS[1]) and window or nil -- see common.lua
local index = floor_div(now, window)
local count = 0
local read = redis.call('MGET', KEYS[1], KEYS[2]) -- the state and the block, read ahead (see common.lua)
local state = load_state(KEYS[1], read[1])

if mode == MODE_CANCEL then
  -- Units taken in a window that has ended need no giving back.
  if state and state[1] == taken_in and state[1] >= index then
    count = math.max(0, state[2] - n)
    store_state(KEYS[1], (taken_in + 1) * window - now, taken_in, count, measured)
  end
  return {1, limit - count, 0, 0, now}
end

-- A count made with another window length (a policy changed) carries over
-- into the current window while the window it was counted in lasts.
-- carried_for is how long such a count still counts.
local carried_for
if state and state[3] and state[3] ~= window then
  if (state[1] + 1) * state[3] > now then
    carried_for = (state[1] + 1) * state[3] - now
    state = {index, state[2], window}
  else
    state = nil
  end
end

-- A stored index ahead of ours means the clock stepped back: keep counting
-- in that window rather than open a fresh one.
if state and state[1] >= index then
  index = state[1]
  count = state[2]
end
local until_end = (index + 1) * window - now

local blocked = blocked_for(KEYS[2], now, read[2])
if blocked > 0 then
  return {0, 0, blocked, blocked, now}
end

if count + n > limit then
  -- nothing is written: a count carried over stops counting when the
  -- window it was counted in ends, if that comes first
  local wait = until_end
  if carried_for and carried_for < wait then
    wait = carried_for
  end
  return {0, limit - count, wait, wait, now}
end
if mode ~= MODE_PEEK then
  count = count + n
  store_state(KEYS[1], until_end, index, count, measured)
end
local reset_after = 0
if count > 0 then
  reset_after = until_end
end
return {1, limit - count, 0, reset_after, now, index, 0}
