-- room.lua: the waiting room of one meter key (TokenBucket or GCRA) of the
-- worker: tasks that could not start wait here, out of asynq's way, and are
-- released one by one, each with the capacity for its start reserved, as
-- the meter's rate allows.
--
-- Releases go in start-time fair queueing order over the waiters' flows (a
-- flow is what a rule shares its limit by, such as a tenant): each waiter
-- gets a start tag S = max(V, F(flow)) when it enters, its flow's finish
-- tag becomes F(flow) = S + scale / weight, and the waiter with the lowest
-- tag goes first, V becoming its tag. A heavy flow that entered first does
-- not hold back a newcomer, whose first waiter is tagged V. In a room that
-- shares by nothing, a waiter's tag is its order of entry: first come,
-- first served. A flow may be held back until an instant (another limit
-- of its own has no room before): its waiters are passed over till then.
--
-- KEYS[1]  the planned instant of the meter key (see common.lua)
-- KEYS[2]  the room: sorted set of waiter IDs by start tag
-- KEYS[3]  the waiters: hash of waiter ID ->
--          "<eligible us>|<tag>|u<units>|<flow length>|<flow><payload>"
--          while waiting (units: what its start takes of the meter; a
--          waiter written without "u<units>|" takes 1)
--          (the tag is kept here too: a sorted set's score comes back
--          written as a float, which not every Lua reads back),
--          "=<end us>:<end ticks>:<slot us>|..." once released (the
--          capacity of its start reserved, up to that instant, for
--          meter_start.lua, its slot at <slot us>)
-- KEYS[4]  the flows: hash of flow -> finish tag; field "" holds V and
--          field "#" the last order of entry
-- KEYS[5]  the flows held back: hash of flow -> until when (Unix us;
--          negated once the flow's first waiter is back for its end)
-- KEYS[6]  the waiters set aside: sorted set, all scores 0, of members
--          "<flow length>:<flow>|<tag, 16 digits><waiter ID>", so that a
--          flow's are together in tag order (ZRANGEBYLEX). A flow held back
--          waits here, out of the room's order, as do its waiters that
--          come meanwhile: they come back to the room one waiter at a
--          time, its first as its hold nears its end and another when it
--          ends, the next whenever one of its waiters is released or leaves.
--          Held flows thus never fill the part of the room a release looks
--          at, and a flow never has waiters here with none in the room nor
--          a hold to bring them back.
-- KEYS[7]  release: the starts instant of the meter key (see
--          meter_start.lua): a start that came late holds back the releases
--          after it, rather than every start after it
-- KEYS[8]  release: the room's dispatcher lease: the ID of the one
--          dispatcher of the fleet that lets the room's waiters out
-- ARGV[1]  mode: 0 enter, 1 release, 2 leave, 3 put a release back,
--          4 resign the dispatcher lease
-- enter:   ARGV[2] waiter ID, ARGV[3] flow (non-empty), ARGV[4] weight
--          (>= 1; 0: first come, first served), ARGV[5] the soonest it
--          may start, in us from now, ARGV[6] payload (opaque),
--          ARGV[7] how long the room's keys outlive their last write, us,
--          ARGV[8] the units its start takes (>= 1; a flow's tags advance
--          by units / weight, so flows share units fairly)
--          Returns {waiters in the room and set aside, 1 if it entered
--          now (0: it was there, or is released: it keeps its place and
--          release, and takes the new payload and, waiting, the later
--          soonest start), now_us}, and when KEYS[8] is given, the
--          dispatcher lease's holder ('' for none) and end, us: a
--          process with waiters here need not ask the room itself while
--          another dispatcher lets them out
-- release: ARGV[2] n, the fewest units a waiter takes, ARGV[3] burst,
--          ARGV[4] num, ARGV[5] den (the meter), ARGV[6] lead: how long
--          before its start a waiter is released, in ticks, ARGV[7] keys'
--          lifetime, us, ARGV[8] notice: the least time from a release to
--          its start, in ticks (at most the lead): a waiter let out late
--          (its dispatcher delayed, or the meter idle before) still has the
--          time it needs to reach a worker, and the meter's capacity before
--          its start goes unused; ARGV[9] the dispatcher's ID (empty: no
--          lease is asked), ARGV[10] how long its lease lasts, us: a
--          release by another dispatcher while the lease lasts releases
--          nothing, each release of the holder renews it, and one that
--          finds the room empty ends it;
--          ARGV[11] K, the waiters prepared for, ARGV[12] now in Unix ns
--          (for asynq), ARGV[13] the window: how much further than the
--          lead the starts of waiters let out after the first in the same
--          call may be, in ticks, ARGV[14] the most waiters to let out in
--          this call; then for each waiter prepared for, its ID, its
--          task's asynq ID, P (its other meters), and five ARGV for each of
--          those meters: units, burst, num, den, grace (ticks). KEYS from
--          KEYS[9]: for each waiter prepared for, in turn, asynq's retry,
--          scheduled and pending keys of its task's queue and the task's
--          hash, then four for each of its meters: its instant, the
--          waiter's ticket, the tickets' generation, its starts. When such
--          a waiter is let out, its slot is booked on each of those meters
--          by its ID (see common_worker.lua's book_at) and its task moved to the
--          head of its queue; a meter with no room at the slot puts the
--          waiter back (as put back does), holds its flow until the meter
--          has room, and ends the call (due now, when it was the first);
--          then pairs of a flow and an instant, Unix us: the flow
--          is held back until then first (its own limit has no room before;
--          a hold that ends sooner than the flow's standing one changes
--          nothing)
--          Returns {1, waiter ID, payload, start delay us, tag, end us,
--          end ticks, flow, now_us, next_us, units, booked, moved} for each
--          waiter released, in turn (next_us: when the next may be;
--          booked: 1 when it was a waiter prepared for, booked on its other
--          meters; moved: common_worker.lua's move_to_head, or -1), then "#" and
--          the IDs and payloads of the first most waiting in the room's
--          order; {0, due_us, now_us} otherwise,
--          due_us the instant to try again (0: the room is empty); {2,
--          lease_end_us, now_us} when another dispatcher holds the lease. A
--          waiter whose units do not fit by the lead keeps its turn: nobody
--          is released before it.
-- leave:   ARGV[2] waiter ID: removes a waiter, or a release nobody came
--          for; ARGV[3] keys' lifetime, us (its flow's next waiter set
--          aside may come back to the room). Returns {1 if it was there,
--          now_us}
-- put back: ARGV[2] waiter ID, ARGV[3] unused, ARGV[4], ARGV[5] the end
--          of its release (us, ticks), ARGV[6] unused, ARGV[7] burst, ARGV[8]
--          num, ARGV[9] den, ARGV[10] hold its flow back until (Unix us; 0:
--          no), ARGV[11] keys' lifetime. The release's capacity is given
--          back as far as nothing later stands on it (see common.lua's
--          cancel), and the waiter waits again with its tag. Returns
--          {1, now_us}
-- resign:  ARGV[2] the dispatcher's ID: its lease ends now, if it holds
--          it. Returns {1 if it held it, now_us}

local SCAN = 64       -- waiters looked at per release for an eligible one

local mode = tonumber(ARGV[1])
local now = server_now()

local R = {room = KEYS[2], waiters = KEYS[3], flows = KEYS[4], held = KEYS[5], aside = KEYS[6]}

if mode == 0 then
  local out = enter_room(R, now, ARGV[2], ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5]), ARGV[6], tonumber(ARGV[7]),
    math.max(1, tonumber(ARGV[8]) or 1))
  if KEYS[8] then
    out[4], out[5] = room_lease(KEYS[8], now)
  end
  return out
end

if mode == 4 then
  if redis.call('GET', KEYS[8]) == ARGV[2] then
    redis.call('DEL', KEYS[8])
    return {1, now}
  end
  return {0, now}
end

if mode == 2 then
  local id = ARGV[2]
  local info = redis.call('HGET', KEYS[3], id)
  local was_in_room = redis.call('ZREM', KEYS[2], id)
  if info then
    if string.sub(info, 1, 1) == '=' then -- let out: its waiting form follows the release's end
      info = string.sub(info, string.find(info, '|', 1, true) + 1)
    end
    local _, flow, _, tag = parse_waiter(info)
    redis.call('ZREM', KEYS[6], aside_member(flow, tag, id))
    if was_in_room == 1 and held_until(R, flow) <= now then
      bring_back(R, flow) -- its flow's next waiter set aside takes its place
      room_keep(R, tonumber(ARGV[3]))
    end
  end
  return {redis.call('HDEL', KEYS[3], id), now}
end

if mode == 3 then
  return {put_back(R, KEYS[1], now, ARGV[2], tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[4]),
    tonumber(ARGV[5]), tonumber(ARGV[10]), tonumber(ARGV[11])), now}
end

-- release
local owner = ARGV[9]
if owner ~= '' then
  local holder = redis.call('GET', KEYS[8])
  if holder and holder ~= owner then
    return {2, now + math.max(0, redis.call('PTTL', KEYS[8])) * 1000, now}
  end
  redis.call('SET', KEYS[8], owner, 'PX', ttl_ms(tonumber(ARGV[10])))
end

-- This call keeps count of the waiters set aside (see common_worker.lua).
R.aside_n = redis.call('ZCARD', KEYS[6])

-- emptied returns, when the room is empty (nobody in it or set aside),
-- what a release of it returns, having given up the lease this call holds:
-- the dispatcher of the next waiter to enter lets it out at its turn,
-- without waiting for the lease to run out. It returns nil otherwise.
local function emptied()
  if R.aside_n > 0 or redis.call('ZCARD', KEYS[2]) > 0 then
    return nil
  end
  if owner ~= '' then
    redis.call('DEL', KEYS[8])
  end
  return {0, 0, now}
end
local n, burst, per_unit, den = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local lead = tonumber(ARGV[6])
local base_lead = lead -- the first release's; those after it in one call reach a window further
local now_ns, window = ARGV[12] or '0', tonumber(ARGV[13]) or 0
local most = math.max(1, tonumber(ARGV[14]) or 1)
-- The waiters prepared for: their task, meters, and where their KEYS and
-- ARGV start.
local prepared, a, k = {}, 15, 9
for _ = 1, tonumber(ARGV[11]) or 0 do
  local parts = tonumber(ARGV[a + 2])
  prepared[ARGV[a]] = {task = ARGV[a + 1], parts = parts, a = a + 3, k = k}
  a, k = a + 3 + 5 * parts, k + 4 + 4 * parts
end
for i = a, #ARGV - 1, 2 do
  local flow, until_us = ARGV[i], tonumber(ARGV[i + 1])
  if until_us > now and until_us > held_until(R, flow) then
    redis.call('HSET', KEYS[5], flow, int(until_us))
    redis.call('PEXPIRE', KEYS[5], ttl_ms(tonumber(ARGV[7])))
  end
end
local tolerance = burst * per_unit
local cost = n * per_unit
local instants = redis.call('MGET', KEYS[1], KEYS[7]) -- read ahead (see common.lua)
local debt = math.max(ticks_until(KEYS[1], now, per_unit, den, instants[1]), ticks_until(KEYS[7], now, per_unit, den, instants[2]))
-- The next start the meter admits comes after wait ticks.
local wait = debt + cost - tolerance
if wait > lead then
  return emptied() or {0, now + ceil_div(wait - lead, den), now}
end
local notice = math.min(math.max(tonumber(ARGV[8]) or 0, 0), lead)
local start = math.max(wait, notice)
local slot_at = now + ceil_div(start, den) -- the meter's next start

-- The room's V (see above): read at the call's first release, and written
-- once, by write_v, before the call returns.
local v
local function write_v()
  if v then
    redis.call('HSET', KEYS[4], '', int(v))
  end
end

-- The meter's instant, moved by each release, is written once, by
-- write_planned, before anything reads it again or the call returns.
local planned = false
local function write_planned()
  if planned then
    store_instant(KEYS[1], now, debt, per_unit, den)
    planned = false
  end
end

-- release lets a waiter out with its start at start ticks from now; its
-- flow's next waiter set aside, if any, takes its place in the room.
local function release(id, info, flow, payload, tag, units)
  debt = math.max(debt, start) + units * per_unit
  planned = true
  local end_us, end_ticks = instant_after(now, debt, den)
  redis.call('ZREM', KEYS[2], id)
  redis.call('HSET', KEYS[3], id, '=' .. int(end_us) .. ':' .. int(end_ticks) .. ':' .. int(now + ceil_div(start, den)) .. '|' .. info)
  v = math.max(v or tonumber(redis.call('HGET', KEYS[4], '')) or 0, tag)
  bring_back(R, flow)
  local booked, moved = 0, -1
  local p = prepared[id]
  if p then
    local slot_us = now + ceil_div(start, den)
    local taken, next_room = {}, 0
    for j = 1, p.parts do
      local pa, pk = p.a + 5 * (j - 1), p.k + 4 + 4 * (j - 1)
      local pn, pburst, pnum, pden = tonumber(ARGV[pa]), tonumber(ARGV[pa + 1]), tonumber(ARGV[pa + 2]), tonumber(ARGV[pa + 3])
      local K = {KEYS[pk], KEYS[pk + 1], KEYS[pk + 2], KEYS[pk + 3]}
      local r = book_at(K, now, pn, pburst, pnum, pden, 0, tonumber(ARGV[pa + 4]), slot_us)
      if r[1] ~= 1 then
        -- This meter has no room at the slot: what the others booked is
        -- given back, and the waiter goes back to its place, its flow
        -- held until the meter has room.
        for t = #taken, 1, -1 do
          local T = taken[t]
          cancel(T[1][1], T[1][2], now, ticks_until(T[1][1], now, T[4], T[5]), T[2] * T[4], T[3] * T[4], T[4], T[5], T[6], T[7])
        end
        write_planned()
        put_back(R, KEYS[1], now, id, burst, per_unit, den, end_us, end_ticks, slot_us + r[3], tonumber(ARGV[7]))
        debt = math.max(ticks_until(KEYS[1], now, per_unit, den), ticks_until(KEYS[7], now, per_unit, den))
        return false
      end
      taken[#taken + 1] = {K, pn, pburst, pnum, pden, r[6], r[7]}
      -- the soonest the meter has room for one more unit after it
      next_room = math.max(next_room, r[6] + ceil_div(r[7] - (pburst - 1) * pnum, pden))
    end
    booked = 1
    if next_room > slot_us and next_room > held_until(R, flow) then
      -- The flow's own limits have no room before then: its next waiter
      -- is held back till then, rather than let out only to be put back.
      hold(R, flow, next_room)
    end
    moved = 3 -- moved at the end of the call (see below)
  end
  -- (The room's keys are kept once, at the end of the call.)
  -- The next release may come when the meter's next start is lead away.
  local next_due = now + math.max(0, ceil_div(debt + cost - tolerance - base_lead, den))
  return {1, id, payload, ceil_div(start, den), int(tag), end_us, end_ticks, flow, now, next_due, units, booked, moved}
end

-- fits returns the start, in ticks from now, of a waiter of units no
-- sooner than at ticks, or nil and the instant to try again when it would
-- come after the lead: the waiter keeps its turn.
local function fits(units, at)
  -- more than the burst never fits: such a waiter goes at the next start,
  -- where its claim fails (its task with it) rather than block the room
  local own = math.max(debt + math.min(units, burst) * per_unit - tolerance, at, 0)
  if own > lead then
    return nil, now + ceil_div(own - lead, den)
  end
  return own
end

local horizon = now + ceil_div(lead, den) -- the latest start this release may give

-- Holds that end within the lead: the flow's first waiter set aside comes
-- back to the room (a hold that has ended is forgotten). next_hold is the
-- soonest end of the others. Done again whenever the horizon moves (the
-- releases after the first in a call look further ahead), so that a flow
-- whose hold ends within the new horizon has its waiter back in time.
local next_hold = 0
local touched = false -- the room's waiters moved: its keys are kept, whoever goes
local function bring_back_due()
  next_hold = 0
  local holds = redis.call('HGETALL', KEYS[5])
  R.holds = {} -- read here, kept by what writes them (see common_worker.lua)
  for i = 1, #holds, 2 do
    local flow, raw = holds[i], tonumber(holds[i + 1])
    R.holds[flow] = raw
    local until_us = math.abs(raw)
    if until_us <= horizon then
      if raw > 0 or until_us <= now then
        bring_back(R, flow)
        touched = true
      end
      if until_us <= now then
        redis.call('HDEL', KEYS[5], flow)
        R.holds[flow] = nil
      elseif raw > 0 then
        hold(R, flow, -until_us) -- brought back once
      end
    elseif next_hold == 0 or until_us < next_hold then
      next_hold = until_us
    end
  end
end
bring_back_due()

-- pick lets out the first waiter in tag order that may start at the
-- meter's next start; when none may, the one that may start soonest, at its
-- time, if that is within the lead (the capacity before it has no taker).
-- A waiter of a flow held back beyond the lead is set aside, out of the
-- way. Returns release's record, or {0, due_us, now_us} when nobody goes,
-- or false when the waiter went back to its place (see release).
local function pick()
  local soonest, first = 0, nil
  for _ = 1, 4 do
    local aside = 0
    -- The room's first SCAN waiters, read a few at a time (the first is
    -- most often the one let out): from, the next place to read, counts in
    -- the room as it is now, those taken out of it on the way left out.
    local from, size, seen = 0, 4, 0
    while from < SCAN and seen < SCAN do
      local waiters = redis.call('ZRANGE', KEYS[2], from, from + size - 1)
      local infos = {}
      if #waiters > 0 then
        infos = redis.call('HMGET', KEYS[3], unpack(waiters))
      end
      local out = 0
      seen = seen + #waiters
      for i = 1, #waiters do
        local id = waiters[i]
        local info = infos[i]
        if not info or string.sub(info, 1, 1) == '=' then
          redis.call('ZREM', KEYS[2], id) -- left, expired, or released
          out = out + 1
        else
          local eligible, flow, payload, tag, units = parse_waiter(info)
          local held_back = held_until(R, flow)
          if held_back > horizon then
            redis.call('ZREM', KEYS[2], id)
            set_aside(R, flow, tag, id)
            aside, out, touched = aside + 1, out + 1, true
          else
            eligible = math.max(eligible, held_back)
            if eligible <= slot_at then
              local at, due = fits(units, start)
              if not at then
                return {0, due, now}
              end
              start = at
              return release(id, info, flow, payload, tag, units)
            end
            if soonest == 0 or eligible < soonest then
              soonest, first = eligible, {id, info, flow, payload, tag, units}
            end
          end
        end
      end
      if #waiters < size then
        break
      end
      from = from + size - out
      size = math.min(2 * size, SCAN - seen)
    end
    if aside == 0 or first then
      break
    end
  end
  if first and soonest <= horizon then
    local at, due = fits(first[6], math.max(start, (soonest - now) * den))
    if not at then
      return {0, due, now}
    end
    start = at
    return release(first[1], first[2], first[3], first[4], first[5], first[6])
  end
  if next_hold > 0 and (soonest == 0 or next_hold < soonest) then
    soonest = next_hold
  end
  if soonest == 0 then
    local empty = emptied()
    if empty then
      return empty
    end
    soonest = now + 1000 -- only released or expired waiters were looked at
  end
  return {0, math.max(now, soonest - ceil_div(lead, den)), now}
end

-- Waiters are let out in one call as long as the next start is within the
-- lead and the window after it, up to most of them, and each but the last
-- was prepared for.
local out, moves = {}, {}
for _ = 1, most do
  local r = pick()
  if r == false then
    if #out == 0 then
      write_v() -- (release wrote the meter's instant before putting back)
      return {0, now, now} -- a meter had no room: try again at once
    end
    break
  end
  if r[1] ~= 1 then
    if #out == 0 then
      if touched then
        room_keep(R, tonumber(ARGV[7])) -- a set it wrote may be new
      end
      return r
    end
    break
  end
  for _, v in ipairs(r) do
    out[#out + 1] = v
  end
  if r[13] == 3 then
    moves[#moves + 1] = {prepared[r[2]], #out} -- its task, its moved field (the last)
  end
  if r[12] ~= 1 then
    -- Not prepared for: its other meters are booked by the caller, which
    -- learns from them whether its flow has room for the next; so it
    -- ends the call.
    break
  end
  wait = debt + cost - tolerance
  lead = base_lead + window
  local further = now + ceil_div(lead, den)
  if further > horizon then
    horizon = further
    bring_back_due()
  end
  if wait > lead then
    break
  end
  start = math.max(wait, notice)
  slot_at = now + ceil_div(start, den)
end
write_v()
write_planned()
room_keep(R, tonumber(ARGV[7])) -- waiters were let out: the room outlives them
-- The tasks go to the head of their queues latest slot first, so that the
-- earliest is taken first.
for i = #moves, 1, -1 do
  local p = moves[i][1]
  out[moves[i][2]] = move_to_head(KEYS[p.k], KEYS[p.k + 1], KEYS[p.k + 2], KEYS[p.k + 3], p.task, now_ns)
end
-- The waiters most likely let out next, to prepare for: the first in the
-- room's order.
out[#out + 1] = '#'
local next_ids = redis.call('ZRANGE', KEYS[2], 0, most - 1)
if #next_ids > 0 then
  local infos = redis.call('HMGET', KEYS[3], unpack(next_ids))
  for i, id in ipairs(next_ids) do
    local info = infos[i]
    if info and string.sub(info, 1, 1) ~= '=' then
      local _, _, payload = parse_waiter(info)
      out[#out + 1] = id
      out[#out + 1] = payload
    end
  end
end
return out
