-- lane_poll.lua: one turn of a queue's return lane in Redis. A task told to
-- come back joins the lane in the call that decided it (meter_start.lua),
-- by its asynq ID, scored by when it is to be moved to the head of its
-- queue. One dispatcher of the fleet at a time, the lane's holder, moves
-- the tasks that are due, in one call for all of them, so that the work of
-- bringing tasks back is done once for the fleet, not once per process. A
-- task still in its handler (asynq shows it active) is looked for again at
-- the next turn, for a minute; a task asynq no longer holds back (run,
-- moved by asynq's own retry, or deleted) leaves the lane. An empty lane
-- has no holder: the next task to join it makes its caller the holder.
--
-- KEYS[1]  asynq:{<queue>}:retry
-- KEYS[2]  asynq:{<queue>}:scheduled
-- KEYS[3]  asynq:{<queue>}:pending
-- KEYS[4]  the lane: sorted set of asynq task IDs by when to move them
--          (Unix ms)
-- KEYS[5]  the lane's holder: the holding dispatcher's name, expiring with
--          its lease
-- KEYS[6..] asynq:{<queue>}:t:<ID> for each ID in ARGV[7..], in order
-- ARGV[1]  the caller's dispatcher
-- ARGV[2]  the holder's lease, ms; 0 gives the lane up if the caller
--          holds it, and does nothing else
-- ARGV[3]  now, Unix ns, for asynq's pending_since
-- ARGV[4]  the window, ms: the IDs of ARGV[7..] due that soon are moved now
-- ARGV[5]  the lookahead, ms: IDs due that soon are named for the next turn
-- ARGV[6]  the most IDs named
-- ARGV[7..] IDs the caller was told were due soon (their keys in KEYS[6..])
-- Returns  {0, the lease's end (us), now_us} when another dispatcher holds
--          the lane; otherwise {1, tasks moved, when the first task left in
--          the lane is due (Unix ms; -1: the lane is empty and has no
--          holder), now_us, the IDs due within the lookahead...}

local self, lease = ARGV[1], tonumber(ARGV[2])
local now = server_now()
local holder = redis.call('GET', KEYS[5])
if lease == 0 then
  if holder == self then
    redis.call('DEL', KEYS[5])
  end
  return {1, 0, -1, now}
end
if holder and holder ~= self then
  return {0, now + math.max(0, redis.call('PTTL', KEYS[5])) * 1000, now}
end

local now_ms = floor_div(now, 1000)
local moved = 0
for i = 7, #ARGV do
  local id = ARGV[i]
  local at = tonumber(redis.call('ZSCORE', KEYS[4], id))
  if at and at <= now_ms + tonumber(ARGV[4]) then
    local result = move_to_head(KEYS[1], KEYS[2], KEYS[3], KEYS[i - 1], id, ARGV[3])
    if result == 1 then
      moved = moved + 1
    end
    if result ~= 2 or at < now_ms - 60000 then
      redis.call('ZREM', KEYS[4], id)
    end
  end
end

local first = redis.call('ZRANGE', KEYS[4], 0, 0, 'WITHSCORES')
if #first == 0 then
  redis.call('DEL', KEYS[5])
  return {1, moved, -1, now}
end
redis.call('SET', KEYS[5], self, 'PX', lease)
local out = {1, moved, tonumber(first[2]), now}
local soon = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now_ms + tonumber(ARGV[5]), 'LIMIT', 0, tonumber(ARGV[6]))
for _, id in ipairs(soon) do
  out[#out + 1] = id
end
return out
