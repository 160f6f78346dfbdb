-- tick_claim.lua: one replica's claim on one tick of a scheduled entry, so
-- that each tick fires on exactly one replica.
--
-- KEYS[1]  the claim: the claiming replica's ID while it produces the tick's
--          batch, then "done"
-- ARGV[1]  mode: 0 claim (only if nobody has), 1 renew (only if ours),
--          2 finish (only if ours)
-- ARGV[2]  the replica's ID
-- ARGV[3]  how long the claim lives, in milliseconds: the lease while
--          producing, or how long "done" is remembered
-- Returns  1 when the claim is (still) ours, else 0

local mode = tonumber(ARGV[1])
local replica = ARGV[2]
local ttl = ARGV[3]

if mode == 0 then
  if redis.call('SET', KEYS[1], replica, 'NX', 'PX', ttl) then
    return 1
  end
  return 0
end
if redis.call('GET', KEYS[1]) ~= replica then
  return 0
end
if mode == 1 then
  redis.call('PEXPIRE', KEYS[1], ttl)
else
  redis.call('SET', KEYS[1], 'done', 'PX', ttl)
end
return 1
