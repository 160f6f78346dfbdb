-- common_worker.lua: helpers of the worker's ways to wait, shared by the
-- scripts that let tasks wait and come back (room.lua, meter_claim.lua,
-- meter_start.lua, meter_booking.lua, concurrency.lua, and the worker's
-- own lane scripts): waiting rooms, return lanes, bookings at an instant,
-- and moving an asynq task to the head of its queue. They stand on the
-- helpers of common.lua, which come before them in every assembled script.

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
  if held_until(R, flow) > now then
    set_aside(R, flow, tag, id)
  else
    local added = redis.call('ZADD', R.room, int(tag), id)
    if R.room_n then
      R.room_n = R.room_n + added
    end
  end
  redis.call('HSET', R.waiters, id, waiting_info(now + after, tag, units, flow, payload))
  -- Every key of the room outlives this write, those it did not write
  -- too: while its meter lets nobody out (blocked), entries are what
  -- keep the holds and the waiters set aside.
  room_keep(R, lifetime)
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
