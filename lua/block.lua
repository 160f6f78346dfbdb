-- block.lua: stops a key's limiter admitting anything for a while, in
-- every process: the fleet-wide backoff after an upstream's 429. Also
-- answers how long a key is still blocked.
--
-- KEYS[1]  the block: the instant it ends, in microseconds
-- ARGV[1]  how long to block, in microseconds, from the server's now; 0 to
--          only ask (nothing is written)
-- Returns  {microseconds the block still holds (0: none), now_us}; a block
--          already ending later than asked is kept

local now = server_now()
local left = blocked_for(KEYS[1], now)
local asked = tonumber(ARGV[1])
if asked > left then
  left = asked
  redis.call('SET', KEYS[1], int(now + left), 'PX', ttl_ms(left))
end
return {left, now}
