-- common.lua: helpers shared by every jobthrottle script.
--
-- Package lua prepends this file to each algorithm's script, so the script
-- Redis runs is self-contained. Nothing here touches a key on its own.
--
-- Numbers. Lua 5.1 numbers are IEEE doubles, exact for every integer below
-- 2^53. Times are integer microseconds read from redis.call('TIME'); package
-- throttle validates each policy so that no intermediate value reaches 2^53.
-- Integers are written back with string.format('%d'), never tostring, which
-- keeps only 14 significant digits.
--
-- State. Counter-like state is a string of integers joined by ':', written
-- with an expiry so that idle keys disappear.

local MODE_TAKE = 0
local MODE_PEEK = 1
local MODE_RESERVE = 2 -- meters only: book a later slot, up to a longest delay
local MODE_CANCEL = 3  -- meters only: give a reservation's units back
local MODE_BLOCK = 4   -- meters only: admit nothing for a while (see block.lua)

-- server_now returns the Redis server's clock in microseconds.
local function server_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- floor_div returns floor(a / b) for integers |a| < 2^53 and b >= 1. The
-- division is exact enough: were a / b just below an integer q, it would be
-- at least 1/b below it, while its rounding error is at most q * 2^-53, less
-- than 1/b since q * b is about |a| < 2^53; so math.floor never rounds up
-- onto q. Package throttle keeps every value the scripts divide below 2^53.
local function floor_div(a, b)
  return math.floor(a / b)
end

-- ceil_div returns ceil(a / b) for integers |a| < 2^53 and b >= 1 (exact,
-- as for floor_div).
local function ceil_div(a, b)
  return math.ceil(a / b)
end

-- int formats an integer-valued number without losing digits.
local function int(x)
  return string.format('%d', x)
end

-- ttl_ms converts a lifetime in microseconds to whole milliseconds for PX,
-- rounded up and never below 1, so a written key always expires and never
-- before its state stops mattering.
local function ttl_ms(us)
  return int(math.max(1, ceil_div(us, 1000)))
end

-- Reading ahead. A reader of one key below takes, as its last argument,
-- the key's value when the script read it already (with others, in one
-- MGET: a command less for each key, which counts at a fleet's pace), false
-- for a key that was absent, nil to have the reader GET it.
--
-- blocked_for returns how long the block at key (KEYS[2] of the window
-- scripts and the leaky bucket, see block.lua) still holds, in
-- microseconds; 0 if none.
local function blocked_for(key, now, value)
  local until_us = value
  if until_us == nil then
    until_us = redis.call('GET', key)
  end
  if until_us then
    return math.max(0, tonumber(until_us) - now)
  end
  return 0
end

-- load_state reads a state of up to four ':'-joined integers; nil when the
-- key is absent. It splits with string.find rather than an iterator, as it
-- runs on every call.
local function load_state(key, raw)
  if raw == nil then
    raw = redis.call('GET', key)
  end
  if not raw then
    return nil
  end
  local fields = {}
  local from = 1
  for i = 1, 4 do
    local colon = string.find(raw, ':', from, true)
    if not colon then
      fields[i] = tonumber(string.sub(raw, from))
      return fields
    end
    fields[i] = tonumber(string.sub(raw, from, colon - 1))
    from = colon + 1
  end
  return fields
end

-- store_state writes one to four integers joined by ':' with an expiry of
-- ttl_us.
local function store_state(key, ttl_us, a, b, c, d)
  local value = int(a)
  if b then
    value = value .. ':' .. int(b)
  end
  if c then
    value = value .. ':' .. int(c)
  end
  if d then
    value = value .. ':' .. int(d)
  end
  redis.call('SET', key, value, 'PX', ttl_ms(ttl_us))
end

-- changeable reports whether key belongs to a named limiter, whose policy
-- may change while its state lives: its name and algorithm ("name@gcra")
-- come before the hash tag. Its states record what measured them (the
-- rate's interval, the window's length) so that another policy can convert
-- them; a limiter without a name keeps its policy in its keys, and its
-- states need not (they stay smaller).
local function changeable(key)
  local tag = string.find(key, '{', 1, true) or (#key + 1)
  local at = string.find(key, '@', 1, true)
  return at ~= nil and at < tag
end

-- Instants. The meters store one instant per key: a microsecond, plus a
-- remainder in ticks of 1/den microsecond, and, for a named limiter, the
-- rate's interval that measured it, num/den microseconds a unit:
-- "<us>:<ticks>:<num>:<den>" ("<us>" or "<us>:<ticks>" without a name,
-- read as measured by the policy reading them). What an instant stands for
-- does not depend on the policy: how many units are spoken for until it,
-- (its distance from now in ticks) / num. A policy reading an instant
-- measured by another converts it so: the units carry over, rounded up, and
-- a limiter whose policy changed keeps what was consumed.

-- convert_ticks returns ticks measured with interval onum/oden as ticks of
-- interval num/den: the same number of units, rounded up, capped below
-- 2^52 so that later arithmetic stays exact.
local function convert_ticks(ticks, onum, num)
  return math.min(math.ceil(ticks * num / onum), 4503599627370496)
end

-- signed_ticks returns how many ticks of den (units of num ticks) from now
-- the instant stored at key lies, negative when it has passed; nil when the
-- key is absent. It also returns the distance as stored, in ticks of the
-- interval onum/oden that measured it, and that interval (num/den when the
-- same): until a policy writes the instant again, it keeps moving at that
-- interval's pace, which a refusal's wait must follow. It is the one
-- reader of the format above, written out without other helpers: it runs
-- on every decision of the meters, and each helper a script defines is a
-- closure made on every call.
local function signed_ticks(key, now, num, den, stored)
  if stored == nil then
    stored = redis.call('GET', key)
  end
  if not stored then
    return nil
  end
  local at, rest, onum, oden = tonumber(stored), 0, num, den
  local f1 = (string.find(stored, ':', 1, true))
  if f1 then
    at = tonumber(string.sub(stored, 1, f1 - 1))
    local f2 = (string.find(stored, ':', f1 + 1, true))
    if f2 then
      local f3 = (string.find(stored, ':', f2 + 1, true))
      rest = tonumber(string.sub(stored, f1 + 1, f2 - 1))
      onum, oden = tonumber(string.sub(stored, f2 + 1, f3 - 1)), tonumber(string.sub(stored, f3 + 1))
    else
      rest = tonumber(string.sub(stored, f1 + 1))
    end
  end
  local ticks = (at - now) * oden + rest
  if onum ~= num or oden ~= den then
    return convert_ticks(ticks, onum, num), ticks, onum, oden
  end
  return ticks, ticks, num, den
end

-- ticks_until returns how many ticks of den (units of num ticks) from now
-- until the instant stored at key; 0 when it is absent or has passed.
local function ticks_until(key, now, num, den, stored)
  return math.max(0, signed_ticks(key, now, num, den, stored) or 0)
end

-- instant_after splits the instant ticks after now into a microsecond and a
-- remainder in ticks.
local function instant_after(now, ticks, den)
  local whole = floor_div(ticks, den)
  return now + whole, ticks - whole * den
end

-- store_instant stores the instant ticks after now, measured with interval
-- num/den, expiring when it comes. It is the one writer of the format
-- above, written out for the reason signed_ticks gives.
local function store_instant(key, now, ticks, num, den)
  local whole = math.floor(ticks / den)
  local rest = ticks - whole * den
  local value
  if changeable(key) then
    value = string.format('%d:%d:%d:%d', now + whole, rest, num, den)
  elseif rest > 0 then
    value = string.format('%d:%d', now + whole, rest)
  else
    value = string.format('%d', now + whole)
  end
  -- expires when the instant comes: ceil(ticks / den) us, in whole ms
  redis.call('SET', key, value, 'PX', string.format('%d', math.max(1, math.ceil(math.max(1, math.ceil(ticks / den)) / 1000))))
end

-- Reservations (TokenBucket and GCRA). Both meters keep one instant, the
-- point up to which capacity is spoken for; "debt" is how far it lies ahead
-- of now, in ticks. A reservation of cost ticks moves it by cost, and its
-- slot starts when the debt left before it has fallen to the tolerance:
-- start = end - tolerance, where end is where the booking moved the instant.
--
-- A ticket key (optional) remembers one caller's booking, as
-- "<end us>:<end ticks>:<grace ticks>:<generation>", until grace after its
-- slot starts: the same caller asking again by then is given that booking
-- rather than a new one. The grace is the booking's own, set when it was
-- made. The generation key beside the state holds the instant the key's
-- current tickets began (written with the first of them, and kept alive as
-- long as the longest lived); a ticket counts only while its generation is
-- the current one, so deleting the generation key (Reset) forgets every
-- ticket of the key at once.

-- meter_reply returns a decision in the scripts' common shape.
local function meter_reply(allowed, debt, tolerance, per_unit, wait, den, now)
  local remaining = math.max(0, floor_div(tolerance - debt, per_unit))
  return {allowed, remaining, ceil_div(wait, den), ceil_div(debt, den), now}
end

-- reserve books cost ticks when the wait for them is at most max_wait
-- ticks, starting no sooner than not_before ticks from now. Booked, it
-- returns the decision, the booking's end instant (us, ticks), which cancel
-- needs, and 1 when the booking is the ticket's standing one; otherwise the
-- wait after which booking would succeed. read, when given, holds the
-- values of generation_key and ticket read ahead (see Reading ahead).
local function reserve(key, ticket, generation_key, now, debt, cost, tolerance, per_unit, den, max_wait, grace, not_before, read)
  local generation
  if ticket then
    local g, t
    if read then
      g, t = read[1], read[2]
    else
      g = redis.call('GET', generation_key)
    end
    generation = tonumber(g)
    local held = load_state(ticket, t)
    if held and held[4] == generation then
      local wait = (held[1] - now) * den + held[2] - tolerance
      if wait + (held[3] or 0) >= 0 then
        local reply = meter_reply(1, debt, tolerance, per_unit, math.max(0, wait), den, now)
        reply[6], reply[7], reply[8] = held[1], held[2], 1
        return reply
      end
    end
  end
  -- A caller that cannot start before not_before takes a slot no sooner:
  -- the meter keeps one instant, so the capacity until then goes unused.
  local wait = debt + cost - tolerance
  if not_before and not_before > 0 then
    wait = math.max(wait, not_before)
  end
  if wait > max_wait then
    return meter_reply(0, debt, tolerance, per_unit, wait - max_wait, den, now)
  end
  debt = wait + tolerance
  store_instant(key, now, debt, per_unit, den)
  local end_us, end_ticks = instant_after(now, debt, den)
  if ticket and wait + grace > 0 then
    -- kept a millisecond past the grace, so a caller arriving at its end
    -- finds it (the check above, not the expiry, decides)
    local ttl_us = ceil_div(wait + grace, den) + 1000
    if not generation then
      generation = now
      store_state(generation_key, ttl_us, generation)
    elseif redis.call('PTTL', generation_key) < ceil_div(ttl_us, 1000) then
      redis.call('PEXPIRE', generation_key, ttl_ms(ttl_us))
    end
    store_state(ticket, ttl_us, end_us, end_ticks, grace, generation)
  end
  local reply = meter_reply(1, debt, tolerance, per_unit, math.max(0, wait), den, now)
  reply[6], reply[7], reply[8] = end_us, end_ticks, 0
  return reply
end

-- block stops a meter admitting anything for block_us: it moves the debt to
-- where one unit conforms exactly when the block ends (so later requests and
-- bookings queue behind it), and records the block's end at block_key for
-- block.lua's queries. Returns the time the block holds.
local function block(key, block_key, now, debt, tolerance, per_unit, den, block_us)
  debt = math.max(debt, block_us * den + tolerance - per_unit)
  store_instant(key, now, debt, per_unit, den)
  local left = math.max(blocked_for(block_key, now), block_us)
  redis.call('SET', block_key, int(now + left), 'PX', ttl_ms(left))
  return {1, 0, left, ceil_div(debt, den), now}
end

-- cancel gives back what it can of an unused booking of cost ticks that
-- ended at (end_us, end_ticks): the part of it still ahead of now (time has
-- already paid for the rest), less what later bookings that start in the
-- future stand on, so that no new booking can share a slot with one of
-- theirs. Returns 1 as allowed when anything was given back.
local function cancel(key, ticket, now, debt, cost, tolerance, per_unit, den, end_us, end_ticks)
  if ticket then
    redis.call('DEL', ticket)
  end
  local to_end = (end_us - now) * den + end_ticks
  local later = math.max(0, debt - math.max(to_end, tolerance))
  local back = math.min(cost, math.max(0, to_end), debt) - later
  if back <= 0 then
    return meter_reply(0, debt, tolerance, per_unit, 0, den, now)
  end
  debt = debt - back
  if debt > 0 then
    store_instant(key, now, debt, per_unit, den)
  else
    redis.call('DEL', key)
  end
  return meter_reply(1, debt, tolerance, per_unit, 0, den, now)
end
