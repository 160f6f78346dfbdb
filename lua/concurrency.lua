-- concurrency.lua: at most limit holders of a key at once, and a line of
-- waiters, first come, first served. Holders are members of a sorted set
-- scored by the instant their lease expires; a holder that stops renewing
-- drops out when its lease runs out. Waiters stand in line in the order
-- they came; a waiter that stops showing itself (its entry's expiry passes)
-- drops out too. While anyone waits, a slot goes to the first waiters in
-- line, not to a caller that does not wait.
--
-- A waiter waits in one of three ways: inline ('i'), handed a slot by the
-- release that frees it and told so by a message on the key's channel
-- ("+<waiter id>"; its entry's payload names the holder it waits as, and
-- its entry stays, granted ('g'), out of the line, until it comes for the
-- slot, or leaves instead, giving the slot back); parked ('p'), away (a
-- task sent back to its queue), with a payload that says where; or called
-- ('c'): a parked waiter near the head of the line, whose payload a release
-- hands to its caller to bring it back in time. A waiter that waits inline
-- for a budget and parks when it runs out is written so ('w'): inline until
-- its entry's time, and parked from then on, with no call of its own to
-- park; a slot handed to it before then is its, after then it is called
-- back instead. A freed slot goes to the
-- first waiter in line that is there (inline): one away keeps its place,
-- and is served in it once back, but does not hold a slot idle meanwhile.
--
-- KEYS[1]  sorted set of holders: member = holder id, score = lease expiry
--          in microseconds
-- KEYS[2]  the line: sorted set of waiter ids by order of coming
-- KEYS[3]  the waiters: hash of waiter id -> "<expiry us>|<way>|<payload>";
--          field '#' counts the waiters that came; way 'w' (inline, then
--          parked) has the payload "<holder id>|<parked expiry us>|<parked
--          payload>" and parks at its expiry
-- ARGV[1]  mode: 0 acquire, 1 peek (count only, write nothing),
--          2 release, 3 renew, 4 wait, 6 leave the line
-- ARGV[2]  holder id (acquire, release, renew, wait), waiter id (leave)
-- ARGV[3]  limit, the most holders at once
-- ARGV[4]  lease length in microseconds
-- ARGV[5]  release, leave: the channel to wake inline waiters on: each
--          waiter's message goes to this channel, ":" and the token its
--          holder id starts with (up to a "."), its process's own
--          wait: how long the entry lasts unless shown again, us
-- ARGV[6]  wait: the waiter id
-- ARGV[7]  release, leave: how far down the line parked waiters are
--          called, beyond the slots free; wait: look, how many
--          places from the head of the line to list the parked waiters of
--          (0: none): the reply then ends with "#" and their ids and
--          payloads, in pairs, so that the caller's next release of the
--          key may prepare for them
-- release, leave: ARGV[8] now in Unix ns (for asynq), ARGV[9] how long
--          the releasing process's holds of the limiter last, on average,
--          us (0: unknown; kept with the line, for waits that park),
--          ARGV[10] look (see wait): when inline waiters are woken, their
--          message goes on, a line each, with "#" and the ids and payloads
--          of the parked waiters in the first look places that this call
--          did not call, telling the process that now holds the slot what
--          its release may prepare for; ARGV[11] M, the parked waiters
--          prepared for, then M pairs of a waiter id and its task's asynq
--          ID; from KEYS[4], four KEYS for each, in turn: asynq's retry,
--          scheduled and pending keys of the task's queue and the task's
--          hash. A prepared waiter that is called has its task moved to the
--          head of its queue in this call (common_worker.lua's move_to_head), and
--          its payload is not returned (only the called waiters whose task
--          was not moved are: not back in asynq yet, or gone)
-- wait:    ARGV[8] budget: how long the waiter may wait here, us (absent
--          or negative: it does not park here), ARGV[9] its payload,
--          ARGV[10] how long its entry lasts, us, ARGV[11] how long the
--          caller's holds last, on average, us (0: unknown). A waiter
--          refused so far back in line that it would not get a slot within
--          budget, at about a hold (the line's, else the caller's) over the
--          limit per waiter ahead of it (there or away: those away come
--          back first), is parked at once, in this call (way 'p');
--          otherwise it waits inline for its budget and is parked when the
--          budget runs out (way 'w'). A waiter handed a slot that it did not
--          take up (it went back) takes the slot when it waits again
-- Returns  {ok (0|1), free slots, retry_after_us, reset_after_us, now_us}
--          acquire: ok = acquired; when full (or others wait), retry_after
--            estimates the wait as the time until the oldest lease runs out
--          release: ok = the lease was still held (0: it had expired);
--            the payloads of the waiters called follow, those of waiters
--            still on their way back to their queue after a "~"
--          renew: ok = the lease was still held and now runs lease again
--          wait: ok = acquired (the waiter leaves the line; or a release
--            handed it the slot already); else (retry_after 0: a
--            waiter asks nothing of it) a sixth value, the waiters in
--            line ahead of it (there or away), a seventh, 1 when it had
--            been called, and an eighth, 1 when it parked, 2 when it
--            parks as its budget runs out
--          leave: ok = it stood in line; the payloads of the waiters
--            called follow, as for release
--          reset_after_us: acquire, peek: until the last current lease
--            runs out; 0 in the other modes, whose callers ask nothing
--            of it

local MODE_ACQUIRE, MODE_RELEASE, MODE_RENEW = 0, 2, 3
local MODE_WAIT, MODE_LEAVE = 4, 6
local SCAN = 256 -- waiters looked at per call, at most
-- AWAY_SETTLE: how long after the line parks a waiter whose budget ran out
-- its task takes to be back in asynq's hands (its handler listens for a
-- slot a little longer, then asynq takes the task back), us.
local AWAY_SETTLE = 120000
local mode = tonumber(ARGV[1])
local limit = tonumber(ARGV[3])
local lease = tonumber(ARGV[4])
local holder = ARGV[2]

local now = server_now()
local open = '(' .. int(now) -- leases expiring after now are live

-- live returns the number of live holders.
local function live()
  return redis.call('ZCOUNT', KEYS[1], open, '+inf')
end

-- until_last returns how long until the last lease runs out.
local function until_last()
  local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  if #last == 0 then
    return 0
  end
  return math.max(0, tonumber(last[2]) - now)
end

-- prune drops expired holders and renews the key's expiry to outlive
-- every lease in it; it returns how long until the last lease runs out.
-- Every holder left is live.
local function prune()
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', int(now))
  local rest = until_last()
  if rest > 0 then
    redis.call('PEXPIRE', KEYS[1], ttl_ms(rest))
  end
  return rest
end

-- outlive renews the key's expiry, when it is shorter, to outlive a lease
-- written now: as every write of a lease calls it, the key outlives every
-- lease in it. (Cheaper than prune: no read of the leases.)
local function outlive()
  if redis.call('PTTL', KEYS[1]) < ceil_div(lease, 1000) then
    redis.call('PEXPIRE', KEYS[1], ttl_ms(lease))
  end
end

-- entry splits a waiter's entry into expiry, way and payload.
local function entry(info)
  local bar = string.find(info, '|', 1, true)
  return tonumber(string.sub(info, 1, bar - 1)), string.sub(info, bar + 1, bar + 1), string.sub(info, bar + 3)
end

-- line walks the first reach (default SCAN) places of the line from its
-- head, a chunk of places a call (the first of first places, when the
-- caller knows how far it will go), dropping waiters whose entry expired,
-- and calls visit(id, way, payload, position, expiry) for each live one
-- (position counts from 0) until visit returns true. Returns the live
-- waiters seen (the last visited included). The waiter self (a wait's own)
-- is visited as there, whatever its entry says: its entry is written after
-- the walk.
local CHUNK = 16
local function line(visit, reach, self, first)
  reach = reach or SCAN
  local seen, from, gone, stopped = 0, 0, {}, false
  local size = math.min(first or CHUNK, CHUNK)
  while not stopped and from < reach do
    local ids = redis.call('ZRANGE', KEYS[2], from, math.min(from + size, reach) - 1)
    local infos = #ids > 0 and redis.call('HMGET', KEYS[3], unpack(ids)) or {}
    for i = 1, #ids do
      local expiry, way, payload = 0, '', ''
      if ids[i] == self then
        expiry, way, payload = now + 1, 'i', holder
      elseif infos[i] then
        expiry, way, payload = entry(infos[i])
      end
      if way == 'w' then
        -- Inline until its expiry, parked from then on; for AWAY_SETTLE in
        -- between, on its way back to its queue ('a'): neither handed a slot
        -- nor called back, as its task is not in asynq's hands yet.
        local holder_id, parked_expiry, parked = string.match(payload, '^([^|]*)|(%d+)|(.*)$')
        if expiry > now then
          way, payload = 'i', holder_id
        elseif expiry + AWAY_SETTLE > now then
          expiry, way, payload = tonumber(parked_expiry), 'a', parked
        else
          expiry, way, payload = tonumber(parked_expiry), 'p', parked
          if expiry > now then
            redis.call('HSET', KEYS[3], ids[i], int(expiry) .. '|p|' .. payload)
          end
        end
      end
      if expiry <= now then
        gone[#gone + 1] = ids[i]
      else
        seen = seen + 1
        stopped = visit(ids[i], way, payload, seen - 1, expiry)
        if stopped then
          break
        end
      end
    end
    stopped = stopped or #ids < size
    from = from + size
    size = CHUNK
  end
  if #gone > 0 then
    redis.call('ZREM', KEYS[2], unpack(gone))
    redis.call('HDEL', KEYS[3], unpack(gone))
  end
  return seen
end

-- keep renews the line's keys' expiry to outlive the entry written.
local function keep(ttl)
  for i = 2, 3 do
    if redis.call('PTTL', KEYS[i]) < ceil_div(ttl, 1000) then
      redis.call('PEXPIRE', KEYS[i], ttl_ms(ttl))
    end
  end
end

-- The parked waiters prepared for (release, leave): waiter id -> the
-- index of its first KEY and its task's asynq ID.
local prepared = {}
if mode == MODE_RELEASE or mode == MODE_LEAVE then
  local k = 4
  for i = 12, 11 + 2 * (tonumber(ARGV[11]) or 0), 2 do
    prepared[ARGV[i]] = {k = k, task = ARGV[i + 1]}
    k = k + 4
  end
end

-- wake hands the free slots to the first waiters in line: inline ones get
-- them, and are told on their own process's channel (see ARGV[5]), and
-- parked ones as far as `ahead` beyond the free slots are called: a
-- prepared one's task is moved to the head of its queue, the others'
-- payloads returned. With look, the parked waiters of the first look
-- places it did not call are told in those messages too (see release).
-- Waiters on their way back to their queue ('a') are called too; their
-- payloads come after a "~", for the caller to bring them back once they
-- are there. count is the live holders.
local function wake(reply, channel, ahead, look, hold, count)
  local free = limit - count
  look = look or 0
  if free <= 0 and ahead <= 0 then
    return reply
  end
  local heads, settling = {'#'}, {'~'}
  -- The waiters woken: how many, and their "+<id>"s by channel token
  -- (tokens: the tokens, in order); what the walk writes, written after it
  -- in one call each: the holders handed a slot (score, member pairs), the
  -- waiters they were, and the waiters' new entries (field, value pairs).
  local woken, by_token, tokens = 0, {}, {}
  local handed, left, entries = {}, {}, {}
  -- It stops at the first place at or past free + ahead and look where
  -- free inline waiters were found: it reads that far at once.
  local seen = line(function(id, way, payload, position, expiry)
    if position >= free + ahead and woken >= free and position >= look then
      return true
    end
    if way == 'i' and woken < free then
      -- Handed over: the slot is the waiter's holder's now, and the message
      -- tells it so ("+"). Its entry stays, granted ('g'), out of the line,
      -- until it comes for the slot or leaves (giving the slot back).
      handed[#handed + 1] = int(now + lease)
      handed[#handed + 1] = payload
      left[#left + 1] = id
      entries[#entries + 1] = id
      entries[#entries + 1] = int(now + lease) .. '|g|' .. payload
      local token = string.match(payload, '^([^.]*)%.') or ''
      if not by_token[token] then
        by_token[token] = {}
        tokens[#tokens + 1] = token
      end
      table.insert(by_token[token], '+' .. id)
      woken = woken + 1
    elseif way == 'a' and position < free + ahead then
      entries[#entries + 1] = id
      entries[#entries + 1] = int(expiry) .. '|c|' .. payload
      settling[#settling + 1] = payload
    elseif way == 'p' and position < free + ahead then
      entries[#entries + 1] = id
      entries[#entries + 1] = int(expiry) .. '|c|' .. payload
      local p = prepared[id]
      if not p or move_to_head(KEYS[p.k], KEYS[p.k + 1], KEYS[p.k + 2], KEYS[p.k + 3], p.task, ARGV[8]) ~= 1 then
        reply[#reply + 1] = payload
      end
    elseif way == 'p' and position < look then
      heads[#heads + 1] = id
      heads[#heads + 1] = payload
    end
    return false
  end, nil, nil, math.max(free + ahead, look) + 1)
  if (hold or 0) > 0 and seen > 0 then
    -- the line's keys' expiry stands
    entries[#entries + 1] = '~hold'
    entries[#entries + 1] = int(hold)
  end
  if #entries > 0 then
    redis.call('HSET', KEYS[3], unpack(entries))
  end
  if #handed > 0 then
    redis.call('ZADD', KEYS[1], unpack(handed))
    redis.call('ZREM', KEYS[2], unpack(left))
  end
  if #settling > 1 then
    for _, v in ipairs(settling) do
      reply[#reply + 1] = v
    end
  end
  if #tokens > 0 then
    outlive() -- the key outlives the leases handed over too
    local listed = ''
    if #heads > 1 then
      listed = '\n' .. table.concat(heads, '\n')
    end
    for _, token in ipairs(tokens) do
      redis.call('PUBLISH', channel .. ':' .. token, table.concat(by_token[token], ',') .. listed)
    end
  end
  return reply
end

if mode == MODE_RELEASE or mode == MODE_RENEW then
  -- Expired holders go first: a holder still there is live.
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', int(now))
  local ok = 0
  if mode == MODE_RELEASE then
    ok = redis.call('ZREM', KEYS[1], holder)
  elseif redis.call('ZSCORE', KEYS[1], holder) then
    redis.call('ZADD', KEYS[1], 'XX', int(now + lease), holder)
    outlive()
    ok = 1
  end
  local count = redis.call('ZCARD', KEYS[1])
  local reply = {ok, math.max(0, limit - count), 0, 0, now}
  if mode == MODE_RELEASE then
    return wake(reply, ARGV[5], tonumber(ARGV[7]), tonumber(ARGV[10]), tonumber(ARGV[9]), count)
  end
  return reply
end

if mode == MODE_LEAVE then
  local id = ARGV[2]
  local info = redis.call('HGET', KEYS[3], id)
  local there = 0
  if info then
    there = 1
    local _, way, payload = entry(info)
    if way == 'g' then
      -- Handed a slot it will not use: the slot is given back.
      redis.call('ZREM', KEYS[1], payload)
    end
  end
  redis.call('ZREM', KEYS[2], id)
  redis.call('HDEL', KEYS[3], id)
  local count = live()
  return wake({there, math.max(0, limit - count), 0, 0, now}, ARGV[5], tonumber(ARGV[7]), tonumber(ARGV[10]), nil, count)
end

local count = live()
local oldest = function()
  local first = redis.call('ZRANGEBYSCORE', KEYS[1], open, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
  if #first == 0 then
    return 0
  end
  return tonumber(first[2]) - now
end

if mode == MODE_WAIT then
  local id, ttl = ARGV[6], tonumber(ARGV[5])
  local got = redis.call('HMGET', KEYS[3], id, '~hold')
  local info, line_hold = got[1], tonumber(got[2])
  local called = 0
  -- lined: it stands in line (a waiter handed a slot stands out of it).
  local lined = false
  if info then
    local _, way, payload = entry(info)
    lined = way ~= 'g'
    if way == 'c' then
      called = 1
    elseif way == 'g' and (tonumber(redis.call('ZSCORE', KEYS[1], payload)) or 0) > now then
      -- A release handed it a slot, and the slot is still held for it:
      -- under this holder id (the message may have been lost), or under
      -- an earlier one that it did not take up (it had gone back to its
      -- queue). The slot is its now, its lease running from now.
      if payload ~= holder then
        redis.call('ZREM', KEYS[1], payload)
      end
      redis.call('HDEL', KEYS[3], id)
      redis.call('ZADD', KEYS[1], int(now + lease), holder)
      outlive()
      return {1, math.max(0, limit - count), 0, 0, now, 0, 0, 0}
    end
  end
  -- The walk: with slots free, until it finds itself or as many waiters
  -- there (inline) ahead of it as slots free, who take them first (those
  -- away do not count); heads: the parked waiters in the first look places.
  -- A waiter not in line yet comes after everyone in it.
  local look = tonumber(ARGV[7]) or 0
  local free = limit - count
  local there, found, heads = 0, false, {}
  local reach = look
  if free > 0 then
    reach = SCAN
  end
  if reach > 0 then
    line(function(other, way, payload, position)
      if other == id then
        found = true
      elseif way == 'i' and not found then
        there = there + 1
      elseif way == 'p' and position < look then
        heads[#heads + 1] = other
        heads[#heads + 1] = payload
      end
      return position + 1 >= look and (free <= 0 or found or there >= free)
    end, reach, id)
  end
  -- listed ends reply with "#" and heads, when asked to look.
  local function listed(reply)
    if look > 0 then
      reply[#reply + 1] = '#'
      for _, v in ipairs(heads) do
        reply[#reply + 1] = v
      end
    end
    return reply
  end
  if free > 0 and there < free then
    if info then
      redis.call('ZREM', KEYS[2], id)
      redis.call('HDEL', KEYS[3], id)
    end
    redis.call('ZADD', KEYS[1], int(now + lease), holder)
    outlive()
    return listed({1, limit - count - 1, 0, 0, now, 0, called, 0})
  end
  -- It waits: in line (at its end when it was not in line), its entry
  -- written once, and the line's keys kept as long as the entry.
  if not lined then
    local order = redis.call('HINCRBY', KEYS[3], '#', 1)
    redis.call('ZADD', KEYS[2], order, id)
  end
  -- ahead: every waiter in line before it, there or away.
  local ahead = redis.call('ZRANK', KEYS[2], id) or 0
  local budget = tonumber(ARGV[8]) or -1
  local hold = 0
  if budget >= 0 and called == 0 then
    hold = line_hold or tonumber(ARGV[11]) or 0
  end
  local parks = 0
  if hold > 0 and (ahead + 1) * hold > budget * limit then
    -- Too far back to wait here: parked at once.
    local park_ttl = tonumber(ARGV[10])
    redis.call('HSET', KEYS[3], id, int(now + park_ttl) .. '|p|' .. ARGV[9])
    keep(math.max(ttl, park_ttl))
    parks = 1
  elseif budget >= 0 and called == 0 and ARGV[9] then
    -- Inline for its budget, parked from then on.
    local away, park_ttl = now + budget, tonumber(ARGV[10])
    redis.call('HSET', KEYS[3], id, int(away) .. '|w|' .. holder .. '|' .. int(away + park_ttl) .. '|' .. ARGV[9])
    keep(math.max(ttl, budget + park_ttl))
    parks = 2
  else
    redis.call('HSET', KEYS[3], id, int(now + ttl) .. '|i|' .. holder)
    keep(ttl)
  end
  return listed({0, math.max(0, limit - count), 0, 0, now, ahead, called, parks})
end

-- acquire or peek: while anyone waits in line (inline, or called back and
-- on its way), the slots are theirs; one parked away holds none.
local waiting = 0
if count < limit then
  line(function(_, way)
    if way ~= 'p' and way ~= 'a' then
      waiting = waiting + 1
    end
    return false
  end)
end
if count >= limit or waiting > 0 then
  -- With no holder to wait for, a waiter takes the slot within moments.
  return {0, math.max(0, limit - count - waiting), math.max(oldest(), 10000), until_last(), now}
end
if mode == MODE_ACQUIRE then
  redis.call('ZADD', KEYS[1], int(now + lease), holder)
  return {1, limit - count - 1, 0, prune(), now}
end
return {1, limit - count, 0, until_last(), now}
