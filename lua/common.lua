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

-- Waiting rooms of the worker (see room.lua). R names a room's keys:
-- R.room, the sorted set of waiters by tag; R.waiters, the hash of their
-- entries; R.flows, the flows' finish tags; R.held, the flows held back;
-- R.aside, the waiters set aside. A call that reads a room's holds and
-- its waiters set aside many times keeps them in R as well: R.holds, the
-- held hash as read (flow -> stored value), and R.aside_n, how many are
-- set aside; a call that counted the room keeps R.room_n. The functions
-- below keep them up to date as they write.

-- room_keep renews the expiry of a room's keys.
local function room_keep(R, lifetime)
  for _, key in ipairs({R.room, R.waiters, R.flows, R.held, R.aside}) do
    redis.call('PEXPIRE', key, ttl_ms(lifetime))
  end
end

-- flow_prefix is what a flow's members of the set aside start with.
local function flow_prefix(flow)
  return int(#flow) .. ':' .. flow .. '|'
end

-- aside_member is a waiter's member in the set aside.
local function aside_member(flow, tag, id)
  local digits = int(tag)
  return flow_prefix(flow) .. string.rep('0', 16 - #digits) .. digits .. id
end

-- first_aside returns the member of flow's first waiter set aside, or nil.
local function first_aside(R, flow)
  local prefix = flow_prefix(flow)
  local found = redis.call('ZRANGEBYLEX', R.aside, '[' .. prefix, '(' .. prefix .. '\255', 'LIMIT', 0, 1)
  return found[1]
end

-- set_aside puts waiter id of flow, tagged tag, among the waiters set aside.
local function set_aside(R, flow, tag, id)
  redis.call('ZADD', R.aside, 0, aside_member(flow, tag, id))
  if R.aside_n then
    R.aside_n = R.aside_n + 1
  end
end

-- bring_back returns flow's first waiter set aside to the room.
local function bring_back(R, flow)
  if R.aside_n == 0 then
    return
  end
  local member = first_aside(R, flow)
  if member then
    local at = #flow_prefix(flow)
    redis.call('ZREM', R.aside, member)
    redis.call('ZADD', R.room, tonumber(string.sub(member, at + 1, at + 16)), string.sub(member, at + 17))
    if R.aside_n then
      R.aside_n = R.aside_n - 1
    end
  end
end

-- held_until returns until when flow is held back (0: it is not). A hold
-- is stored negated once its flow's first waiter set aside was brought
-- back for its end.
local function held_until(R, flow)
  if R.holds then
    return math.abs(tonumber(R.holds[flow]) or 0)
  end
  return math.abs(tonumber(redis.call('HGET', R.held, flow)) or 0)
end

-- waiting_count returns how many wait in the room and set aside, from
-- R.room_n and R.aside_n where the call knows them.
local function waiting_count(R)
  return (R.room_n or redis.call('ZCARD', R.room)) + (R.aside_n or redis.call('ZCARD', R.aside))
end

-- hold stores how flow is held back (value as the held hash holds it).
local function hold(R, flow, value)
  redis.call('HSET', R.held, flow, int(value))
  if R.holds then
    R.holds[flow] = value
  end
end

-- parse_waiter splits a waiting waiter's entry into eligible, flow,
-- payload, tag and units.
local function parse_waiter(info)
  local bar = string.find(info, '|', 1, true)
  local eligible = tonumber(string.sub(info, 1, bar - 1))
  local bar2 = string.find(info, '|', bar + 1, true)
  local tag = tonumber(string.sub(info, bar + 1, bar2 - 1))
  local units = 1
  if string.sub(info, bar2 + 1, bar2 + 1) == 'u' then
    local bar3 = string.find(info, '|', bar2 + 1, true)
    units = tonumber(string.sub(info, bar2 + 2, bar3 - 1))
    bar2 = bar3
  end
  local bar3 = string.find(info, '|', bar2 + 1, true)
  local length = tonumber(string.sub(info, bar2 + 1, bar3 - 1))
  local flow = string.sub(info, bar3 + 1, bar3 + length)
  return eligible, flow, string.sub(info, bar3 + length + 1), tag, units
end

-- waiting_info writes a waiting waiter's entry.
local function waiting_info(eligible, tag, units, flow, payload)
  return int(eligible) .. '|' .. int(tag) .. '|u' .. int(units) .. '|' .. int(#flow) .. '|' .. flow .. payload
end

-- room_lease returns who holds a room's dispatcher lease (key; see
-- room.lua's release) and when it ends, us on the Redis clock: '' and 0
-- when nobody does.
local function room_lease(key, now)
  local holder = redis.call('GET', key)
  if not holder then
    return '', 0
  end
  return holder, now + math.max(0, redis.call('PTTL', key)) * 1000
end

-- join_lane puts the asynq task id in its queue's return lane (see the
-- worker's lane_poll.lua), to be moved to the head of its queue at at_ms
-- (Unix ms), and makes self the lane's holder for lease_ms when nobody
-- holds it; the lane is kept at least keep_ms. Returns the holder and when
-- its lease ends (us).
local function join_lane(lane, holder_key, id, at_ms, self, lease_ms, keep_ms, now)
  redis.call('ZADD', lane, at_ms, id)
  if redis.call('PTTL', lane) < keep_ms then
    redis.call('PEXPIRE', lane, keep_ms)
  end
  if redis.call('SET', holder_key, self, 'NX', 'PX', lease_ms) then
    return self, now + lease_ms * 1000
  end
  return room_lease(holder_key, now)
end

-- enter_room puts waiter id of flow in a room, to start no sooner than
-- after us from now, its start taking units; weight 0 queues it first
-- come, first served, 1 and more share the room fairly between flows (a
-- flow's tags advance by units × 1,000,000 / weight). A waiter there
-- already (a task handed over to a copy of itself comes back under a new
-- asynq ID) keeps its place, tag and release, and takes the new payload
-- and, waiting, the later soonest start. known is its entry in the
-- waiters' hash when the caller read it already (false: it has none), nil
-- when not. Returns {waiters in the room and set aside, 1 if it entered
-- now, now}.
local function enter_room(R, now, id, flow, weight, after, payload, lifetime, units, known)
  if known == nil then
    known = redis.call('HGET', R.waiters, id)
  end
  if known then
    local released, waiting = '', known
    if string.sub(known, 1, 1) == '=' then
      local bar = string.find(known, '|', 1, true)
      released, waiting = string.sub(known, 1, bar), string.sub(known, bar + 1)
    end
    local eligible, old_flow, _, tag = parse_waiter(waiting)
    if released == '' then
      eligible = math.max(eligible, now + after)
    end
    redis.call('HSET', R.waiters, id, released .. waiting_info(eligible, tag, units, old_flow, payload))
    room_keep(R, lifetime)
    return {waiting_count(R), 0, now}
  end
  local tag
  if weight == 0 then
    tag = redis.call('HINCRBY', R.flows, '#', 1)
  else
    local tags = redis.call('HMGET', R.flows, '', flow) -- V, the flow's finish
    tag = math.max(tonumber(tags[1]) or 0, tonumber(tags[2]) or 0)
    redis.call('HSET', R.flows, flow, int(tag + units * math.max(1, floor_div(1000000, weight))))
  end
  local into = R.room
  if held_until(R, flow) > now then
    set_aside(R, flow, tag, id)
    into = R.aside
  else
    local added = redis.call('ZADD', R.room, int(tag), id)
    if R.room_n then
      R.room_n = R.room_n + added
    end
  end
  redis.call('HSET', R.waiters, id, waiting_info(now + after, tag, units, flow, payload))
  -- The keys written outlive this write (the others, a release's).
  for _, key in ipairs({R.waiters, R.flows, into}) do
    redis.call('PEXPIRE', key, ttl_ms(lifetime))
  end
  return {waiting_count(R), 1, now}
end

-- put_back returns a released waiter id of a room to its place: the
-- release's capacity (units, ending at end_us and end_ticks) given back to
-- the room's meter at state as far as nothing later stands on it (see
-- cancel), its waiting entry restored, and its flow held back until
-- until_us (Unix us; 0: not), its waiter set aside meanwhile. Returns 1,
-- or 0 when it was used meanwhile, or is gone.
local function put_back(R, state, now, id, burst, per_unit, den, end_us, end_ticks, until_us, lifetime)
  local info = redis.call('HGET', R.waiters, id)
  if not info or string.sub(info, 1, 1) ~= '=' then
    return 0
  end
  -- The waiting form is kept after the release's end: "=<end>|<waiting>".
  local waiting = string.sub(info, string.find(info, '|', 1, true) + 1)
  local _, flow, _, tag, units = parse_waiter(waiting)
  local debt = ticks_until(state, now, per_unit, den)
  cancel(state, nil, now, debt, units * per_unit, burst * per_unit, per_unit, den, end_us, end_ticks)
  redis.call('HSET', R.waiters, id, waiting)
  if until_us > now then
    hold(R, flow, until_us)
    set_aside(R, flow, tag, id)
  else
    redis.call('ZADD', R.room, int(tag), id)
  end
  room_keep(R, lifetime)
  return 1
end

-- book_at books n units of a meter for a ticket at the instant at (Unix
-- us), or up to max_wait ticks after it, and after the key's starts (see
-- meter_start.lua); the ticket's standing booking for another instant is
-- given back first, and one for this instant is returned as it is. K:
-- {the meter's instant, the ticket, the generation of the key's tickets,
-- the starts instant}. Returns reserve's reply.
local function book_at(K, now, n, burst, per_unit, den, max_wait, grace, at)
  local tolerance, cost = burst * per_unit, n * per_unit
  local read = redis.call('MGET', K[1], K[2], K[3], K[4]) -- see Reading ahead
  local debt = ticks_until(K[1], now, per_unit, den, read[1])
  local held = load_state(K[2], read[2])
  local ticket = read[2]
  if held and held[4] == tonumber(read[3])
    and held[1] + ceil_div(held[2] - tolerance, den) ~= at then
    cancel(K[1], K[2], now, debt, cost, tolerance, per_unit, den, held[1], held[2])
    debt = ticks_until(K[1], now, per_unit, den)
    ticket = false -- cancel deleted it
  end
  debt = math.max(debt, ticks_until(K[4], now, per_unit, den, read[4]))
  local from = math.max(0, (at - now) * den)
  return reserve(K[1], K[2], K[3], now, debt, cost, tolerance, per_unit, den, max_wait + from, grace, from, {read[3], ticket})
end

-- move_to_head moves asynq task id from its queue's retry or scheduled set
-- to the head of the queue (asynq v0.26's keys: retry, scheduled, pending
-- and the task's hash, all in the queue's Cluster slot), marking it
-- pending since now_ns. Returns 1 moved, 2 not there yet (still active:
-- its handler has not returned), 0 gone (run, moved by asynq, deleted).
local function move_to_head(retry, scheduled, pending, task, id, now_ns)
  if redis.call('ZREM', retry, id) == 1 or redis.call('ZREM', scheduled, id) == 1 then
    redis.call('RPUSH', pending, id) -- the head: workers pop from the right
    redis.call('HSET', task, 'state', 'pending', 'pending_since', now_ns)
    return 1
  end
  if redis.call('HGET', task, 'state') == 'active' then
    return 2
  end
  return 0
end
