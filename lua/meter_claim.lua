-- meter_claim.lua: a task's start under one meter rule (TokenBucket or
-- GCRA) of the worker, for a task that waits in a meter's room (see
-- room.lua): one under several meters, or under one that shares its limit
-- fairly. Every start is at a slot the planned meter (the limiter's own
-- state) admits, decided on the Redis clock:
--
--   - a task released from the room, or holding a booking made for it at
--     its release (by ticket, see common.lua), starts at its slot if it
--     comes no later than grace after it; later, the slot is lost, and the
--     task waits in the room again;
--   - a fresh task takes room there is at the meter's next start, within
--     the caller's wait, when nobody waits in the room; or, at an instant
--     given (its start under its other meters), room there is then.
--
-- Each start also moves the starts instant (see meter_start.lua) as a start
-- at its slot would, so that tasks that start by meter_start.lua on the same
-- key are spaced from these too.
--
-- KEYS[1]  the planned instant (see common.lua)
-- KEYS[2]  the starts instant, the same form
-- KEYS[3]  the key's block (see block.lua): no start while it holds
-- KEYS[4]  by room: the room's waiters (see room.lua); by ticket: the
--          ticket; else absent
-- KEYS[5]  by room: the room; by ticket: the generation of the key's
--          tickets; else absent
-- KEYS[6]  by room: the waiters set aside (see room.lua); a fresh task
--          takes nothing while anyone waits, there or in the room
-- ARGV[1]  mode: 0 claim or take, 1 undo a take, 2 claim under several
--          meters at once (see below)
-- ARGV[2]  n, units (1 <= n <= burst, checked by the caller)
-- ARGV[3]  burst
-- ARGV[4]  num } one unit is num/den microseconds of the rate, the fraction
-- ARGV[5]  den }   in lowest terms
-- ARGV[6]  where the task's capacity may be held: 0 nowhere, 1 a ticket,
--          2 the room
-- ARGV[7]  by room: the waiter's ID
-- claim:   ARGV[8] the instant of the start, Unix us (0: the meter's next
--            start); a held slot elsewhere is given back and room taken
--            at the instant instead
--          ARGV[9] without an instant: the longest the caller waits for
--            the meter's next start, in ticks
--          ARGV[10] grace: how late after its slot a held start may still
--            be claimed, us
-- undo:    ARGV[8], ARGV[9] the planned end instant the take returned (us,
--            ticks), ARGV[10] by room: the release the claim used, to put
--            back ("" for none)
-- ARGV[11] by room: how long the room's keys outlive a write, us
-- Returns  {status, slot_us, now_us, planned_end_us, planned_end_ticks,
--          release}
--          status 1: admitted at slot_us, by the capacity the task held
--            (release: the waiter's release, for undo)
--          status 5: admitted at slot_us, the capacity taken now (the
--            planned end is what undo needs)
--          status 0: not admitted: slot_us is when the meter would have
--            room, 0 when the room decides (others wait in it, or the
--            task does); a released waiter whose key is blocked at its
--            slot waits in the room again, in its place, till the block
--            ends
--          status 6: late: the task held a slot that passed more than grace
--            ago (slot_us); it is its no more, and a released waiter
--            waits in the room again, in its place
--          undo: status 1 when anything was given back
--
-- Several meters (mode 2), for a task under several rules, in one call:
-- the KEYS of each meter in turn, six each (those a meter does not use
-- are keys of its own, in its slot, left alone), and from ARGV[2] its ten
-- arguments ARGV[2] to ARGV[11] above, in turn. The first meter claims as
-- asked; each other one at the first's slot (its instant argument is not
-- read). The claims stop at the first meter that does not admit the task,
-- after giving back what the meters before it took. Returns the six
-- values above for each meter claimed, in turn, up to and including that
-- one.
--
-- Entering the room: when the first meter's start is by room, three more
-- KEYS, its room's flows, flows held back and dispatcher lease (see
-- room.lua), and four more
-- ARGV, the waiter's flow, its weight, how long after now a waiter late
-- for its slot may be let out again (us), and its payload, have a task
-- that is refused (but a released waiter's start refused by another meter)
-- enter the room (see room.lua's enter), no sooner than the refusing
-- meter has room, in the same call. The reply then ends with enter's
-- five values: {waiters, 1 if it entered now, now_us, lease holder ('' for
-- none), lease end us}.

local now = server_now()

-- read_entries: the room's entries claim read, by waiters' key and waiter ID
-- (false: none), and read_counts the sizes of the sets it counted, by key,
-- so that entering the room reads none of them again.
local read_entries, read_counts = {}, {}

-- wait_again puts a released waiter back in the room, in its place,
-- waiting as `waiting` says.
local function wait_again(K, A, waiter, waiting)
  local b1 = string.find(waiting, '|', 1, true)
  local b2 = string.find(waiting, '|', b1 + 1, true)
  redis.call('HSET', K[4], waiter, waiting)
  read_entries[K[4] .. '\0' .. waiter] = nil -- read again when needed
  redis.call('ZADD', K[5], string.sub(waiting, b1 + 1, b2 - 1), waiter)
  read_counts[K[5]] = nil
  for i = 4, 5 do
    redis.call('PEXPIRE', K[i], ttl_ms(tonumber(A[11])))
  end
end

-- undo gives back a claim (mode 1).
local function undo(K, A)
  local n, burst, per_unit, den = tonumber(A[2]), tonumber(A[3]), tonumber(A[4]), tonumber(A[5])
  local source, waiter = tonumber(A[6]), A[7]
  local tolerance, cost = burst * per_unit, n * per_unit
  local debt = ticks_until(K[1], now, per_unit, den)
  local back = cancel(K[1], nil, now, debt, cost, tolerance, per_unit, den, tonumber(A[8]), tonumber(A[9]))[1]
  if source == 2 and A[10] ~= '' then
    redis.call('HSET', K[4], waiter, A[10])
    read_entries[K[4] .. '\0' .. waiter] = nil
    redis.call('PEXPIRE', K[4], ttl_ms(tonumber(A[11])))
  end
  return {back, 0, now, 0, 0, ''}
end

-- claim claims a start (mode 0) under the meter whose keys are K and
-- arguments A, laid out as KEYS and ARGV above.
local function claim(K, A)
  local n, burst, per_unit, den = tonumber(A[2]), tonumber(A[3]), tonumber(A[4]), tonumber(A[5])
  local source, waiter = tonumber(A[6]), A[7]
  local tolerance, cost = burst * per_unit, n * per_unit

  local at, grace = tonumber(A[8]), tonumber(A[10])
  -- The meter's keys read ahead, in one call (see common.lua): its
  -- instants and block, and the ticket and its generation when held so.
  local ahead = {K[1], K[2], K[3]}
  if source == 1 then
    ahead[4], ahead[5] = K[4], K[5]
  end
  local read = redis.call('MGET', unpack(ahead))

  -- record moves the starts instant past a start at slot (ticks from now);
  -- a start recorded after a later one leaves it where it is.
  local function record(slot)
    local starts = math.max(signed_ticks(K[2], now, per_unit, den, read[2]) or slot, slot + cost)
    if starts > 0 then
      store_instant(K[2], now, starts, per_unit, den)
    end
  end

  -- The capacity the task holds, and its slot (us).
  local held, release = nil, ''
  if source == 1 then
    local ticket = load_state(K[4], read[4])
    local generation = tonumber(read[5])
    if ticket and ticket[4] == generation then
      held = ticket[1] + ceil_div(ticket[2] - tolerance, den)
    end
  elseif source == 2 then
    local info = redis.call('HGET', K[4], waiter)
    read_entries[K[4] .. '\0' .. waiter] = info
    if info and string.sub(info, 1, 1) == '=' then
      -- "=<end us>:<end ticks>:<slot us>|..."
      local c1 = string.find(info, ':', 1, true)
      local c2 = string.find(info, ':', c1 + 1, true)
      local bar = string.find(info, '|', 1, true)
      held, release = tonumber(string.sub(info, c2 + 1, bar - 1)), info
    elseif info then
      return {0, 0, now, 0, 0, ''} -- the room decides
    else
      for i = 5, 6 do
        read_counts[K[i]] = redis.call('ZCARD', K[i])
        if read_counts[K[i]] > 0 then
          return {0, 0, now, 0, 0, ''} -- the room decides
        end
      end
    end
  end

  if held and (at == 0 or held == at) then
    if held < now - grace then
      if release ~= '' then
        -- Back to its place in the room, to be released again.
        wait_again(K, A, waiter, string.sub(release, string.find(release, '|', 1, true) + 1))
      end
      return {6, held, now, 0, 0, ''}
    end
    local blocked = blocked_for(K[3], now, read[3])
    if blocked > held - now then
      if release ~= '' then
        -- Back to its place in the room, to be released after the block.
        local waiting = string.sub(release, string.find(release, '|', 1, true) + 1)
        local bar = string.find(waiting, '|', 1, true)
        wait_again(K, A, waiter, int(now + blocked) .. string.sub(waiting, bar))
      end
      return {0, now + blocked, now, 0, 0, ''}
    end
    if release ~= '' then
      redis.call('HDEL', K[4], waiter) -- used
    end
    record((held - now) * den)
    return {1, held, now, 0, 0, release}
  end

  -- No capacity held (or held for another instant, which is given back):
  -- take room there is at the instant, or at the meter's next start.
  local planned = signed_ticks(K[1], now, per_unit, den, read[1])
  local debt = math.max(planned or 0, 0)
  if held then
    local ticket = load_state(K[4], read[4])
    cancel(K[1], K[4], now, debt, cost, tolerance, per_unit, den, ticket[1], ticket[2])
    planned = signed_ticks(K[1], now, per_unit, den)
  end
  local free = -2 ^ 52 -- the soonest start the planned meter admits, ticks
  if planned then
    free = planned + cost - tolerance
  end
  local slot
  if at > 0 then
    slot = (at - now) * den
    if free > slot then
      return {0, now + ceil_div(math.max(free, 0), den), now, 0, 0, ''}
    end
  else
    slot = math.max(free, 0)
    if slot > tonumber(A[9]) then
      return {0, now + ceil_div(slot, den), now, 0, 0, ''}
    end
    slot = ceil_div(slot, den) * den -- on a whole microsecond, as others will be
  end
  -- (An instant given can be just past: the start under the task's other
  -- meters, decided a call earlier on another Cluster node. Only a block
  -- refuses it here, not the absence of one.)
  local blocked = blocked_for(K[3], now, read[3])
  if blocked > 0 and blocked * den > slot then
    return {0, now + blocked, now, 0, 0, ''}
  end
  local debt_after = math.max(planned or slot, slot) + cost
  local end_us, end_ticks = 0, 0
  if debt_after > 0 then
    store_instant(K[1], now, debt_after, per_unit, den)
    end_us, end_ticks = instant_after(now, debt_after, den)
  end
  record(slot)
  return {5, now + floor_div(slot, den), now, end_us, end_ticks, ''}
end

-- part returns the keys and arguments of the i-th meter (from 1) of a
-- claim under several (mode 2).
local function part(i)
  local K, A = {}, {'0'}
  for j = 1, 6 do
    K[j] = KEYS[6 * (i - 1) + j]
  end
  for j = 2, 11 do
    A[j] = ARGV[10 * (i - 1) + j]
  end
  return K, A
end

local mode = tonumber(ARGV[1])
if mode == 1 then
  return undo(KEYS, ARGV)
elseif mode == 0 then
  return claim(KEYS, ARGV)
end
-- Several meters: the first claims as asked, the others at its slot.
local out, taken = {}, {}
local meters = math.floor(#KEYS / 6)
local first = 0 -- the first meter's status
local along_wait = 0
for i = 1, meters do
  local K, A = part(i)
  if i > 1 then
    A[8] = out[2] -- the first's slot
  end
  local r = claim(K, A)
  for _, v in ipairs(r) do
    out[#out + 1] = v
  end
  if i == 1 then
    first = r[1]
  end
  if r[1] ~= 1 and r[1] ~= 5 then
    -- Not admitted: what the meters before it took is given back.
    for j = #taken, 1, -1 do
      local TK, TA, tr = taken[j][1], taken[j][2], taken[j][3]
      if tr[4] ~= 0 or tr[6] ~= '' then
        TA[8], TA[9], TA[10] = tr[4], tr[5], tr[6]
        undo(TK, TA)
      end
    end
    if i > 1 and r[2] > now then
      along_wait = r[2] - now
    end
    break
  end
  taken[#taken + 1] = {K, A, r}
end
if #KEYS % 6 ~= 3 or #taken == meters or first == 1 then
  return out
end
-- Refused, and not a released waiter's start: the task waits in the first
-- meter's room.
local K1, E = part(1), 10 * meters + 1
local R = {room = K1[5], waiters = K1[4], flows = KEYS[#KEYS - 2], held = KEYS[#KEYS - 1], aside = K1[6],
  room_n = read_counts[K1[5]], aside_n = read_counts[K1[6]]}
local after = along_wait
if first == 6 then
  after = tonumber(ARGV[E + 3])
end
local entered = enter_room(R, now, ARGV[7], ARGV[E + 1], tonumber(ARGV[E + 2]), after, ARGV[E + 4], tonumber(ARGV[11]),
  tonumber(ARGV[2]), read_entries[R.waiters .. '\0' .. ARGV[7]])
for _, v in ipairs(entered) do
  out[#out + 1] = v
end
out[#out + 1], out[#out + 2] = room_lease(KEYS[#KEYS], now)
return out
