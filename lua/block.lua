-- block.lua: stops a key's limiter admitting anything for a while, in
-- every process: the fleet-wide backoff after an upstream's 429.
--
-- KEYS[1]  the block: the instant it ends, in microseconds
-- ARGV[1]  how long to block, in microseconds, from the server's now
-- Returns  {the block's end in us, now_us}; an existing later end is kept

local now = server_now()
local until_us = now + tonumber(ARGV[1])
local current = redis.call('GET', KEYS[1])
if current and tonumber(current) > until_us then
  until_us = tonumber(current)
end
redis.call('SET', KEYS[1], int(until_us), 'PX', ttl_ms(until_us - now))
return {until_us, now}
