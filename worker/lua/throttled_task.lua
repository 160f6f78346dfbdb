-- throttled_task.lua: counts how often one queued task has been throttled
-- by one rule, and since when, for the worker's give-up policy (asynq keeps
-- no custom counters in a task, so they live here, keyed by task ID).
--
-- KEYS[1]  hash of the task's counts: field "<rule>" = times throttled,
--          field "<rule>@" = when it was first throttled (us)
-- ARGV[1]  rule name
-- ARGV[2]  how long to keep the counts after the latest throttle, in us
-- Returns  {times throttled, us since the first throttle, now_us}

local rule = ARGV[1]
local keep = tonumber(ARGV[2])
local now = server_now()
local times = redis.call('HINCRBY', KEYS[1], rule, 1)
redis.call('HSETNX', KEYS[1], rule .. '@', int(now))
local first = tonumber(redis.call('HGET', KEYS[1], rule .. '@'))
redis.call('PEXPIRE', KEYS[1], ttl_ms(keep))
return {times, now - first, now}
