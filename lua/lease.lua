-- lease.lua: shares of a key's rate leased to processes, which decide
-- within their share in memory, and the rest of the rate, which this script
-- decides itself for processes that hold no share.
--
-- A holder's grant is a rate (units per second) and a burst (units) for a
-- lease. While any grant is out, the part of the policy the grants leave
-- (the "rest") is a token bucket whose rate and capacity are the policy's
-- less what the grants account for, so at every instant the grants and the
-- rest add up to at most the policy's rate and burst, and the fleet's
-- admissions in any span of d seconds to at most burst + rate * d.
--
-- What a grant accounts for. A grant counts from the moment this script
-- makes it to its lease's end. A renewal that lowers it keeps the old grant
-- counted until the old lease's end (the holder may go on deciding under
-- it until the answer reaches it), a renewal that raises it counts the new
-- one at once. A holder's local bucket starts with the tokens the rest
-- hands it (those beyond the rest's capacity once the grant is out, never
-- more than the grant's burst; none may be) and keeps its tokens across
-- renewals (cut to a lower burst), so it never holds more than its burst
-- nor refills faster than its rate, and no token is made twice: the sum
-- over holders and the rest never exceeds the policy's envelope.
--
-- KEYS[1]  the key's lease state, a hash:
--            at         the instant, microseconds, the rest was settled to
--            rest       the rest's tokens (a decimal)
--            asked      units asked of the rest since `since` by callers
--                       that hold no share (a holder's demand is its own)
--            since      when that count began, microseconds
--            want       the rest's last measured demand, units per second
--            h:<id>     a holder's grant, "rate:burst:end:prev_rate:
--                       prev_burst:prev_end:demand" (decimals; ends in
--                       microseconds); prev_* is the grant still counted
--                       until prev_end after a renewal lowered it
-- KEYS[2]  the key's block (Limiter.BlockFor, see block.lua): while it
--          holds, the rest admits nothing and no share is granted
-- ARGV[1]  mode: 0 take n units from the rest, 1 grant or renew a share,
--          2 release a share, 3 read the state (writes nothing)
-- ARGV[2]  the policy's rate, units per second (a decimal > 0)
-- ARGV[3]  the policy's burst, units (an integer >= 1)
-- ARGV[4]  take: n, the units asked (1 <= n <= burst)
--          grant and release: the holder's ID
-- ARGV[5]  take: 1 when the caller holds or asked for a share (its demand
--          is counted as its own), else 0
-- ARGV[5]  grant: the holder's demand, units per second (a decimal >= 0)
-- ARGV[6]  grant: the lease, microseconds (an integer >= 1)
-- ARGV[7]  grant: the least burst worth a share, units (a decimal > 0):
--          a share gets at least this burst when the others leave it, and
--          none is granted otherwise
-- ARGV[8]  grant: units the holder asked of the rest without asking for
--          a share (before its first request, or while it wanted too
--          little for one) since its last request (a decimal >= 0): unless
--          it still wants too little, they are taken out of the rest's
--          demand, the demand of processes that ask for no share, measured
--          over a quarter of a lease
-- Returns  take:    {allowed (0|1), remaining (whole units), retry_after_us, now_us}
--          grant:   {rate, burst, lease_us, now_us, again_us, given,
--                   registered}; rate and burst are decimal strings, "0"
--                   when nothing is granted; again_us, when the grant is
--                   less than the holder's fair part for the others'
--                   grants still counted, is how soon one of those stops
--                   counting (0: none), for the holder to ask again then;
--                   given, the rest's tokens handed to the share with the
--                   capacity it took (a decimal string), which the holder
--                   adds to its bucket; registered, 1 when the holder's
--                   demand is kept as its own, 0 when it wants too little
--                   for a share and its demand is the rest's
--          release: {1, now_us}
--          read:    {now_us, rest rate, rest burst, rest tokens, rest demand,
--                   then for each holder: id, rate, burst, end_us,
--                   counted rate, counted burst, demand}; decimals as strings
--
-- Numbers. Rates, bursts and tokens are doubles written with %.17f (no
-- exponent); times are integer microseconds from TIME. The state
-- expires once every lease has ended and the rest would be full again.

local MODE_TAKE_REST, MODE_GRANT, MODE_RELEASE, MODE_READ = 0, 1, 2, 3

local mode = tonumber(ARGV[1])
local rate, burst = tonumber(ARGV[2]), tonumber(ARGV[3])
local per_us = rate / 1000000
local key = KEYS[1]
local now = server_now()

-- dec writes a decimal without an exponent (the Lua of miniredis reads
-- none back), to 17 places.
local function dec(x)
  return string.format('%.17f', x)
end

-- Holders, parsed: id -> {rate, burst, end, prate, pburst, pend, demand}.
local raw = redis.call('HGETALL', key)
local state, holders, ids = {}, {}, {}
for i = 1, #raw, 2 do
  local f, v = raw[i], raw[i + 1]
  if string.sub(f, 1, 2) == 'h:' then
    local p = {}
    for part in string.gmatch(v, '[^:]+') do
      p[#p + 1] = tonumber(part)
    end
    local id = string.sub(f, 3)
    holders[id] = {rate = p[1], burst = p[2], ends = p[3], prate = p[4], pburst = p[5], pend = p[6], demand = p[7]}
    ids[#ids + 1] = id
  else
    state[f] = v
  end
end
table.sort(ids) -- a fixed order: the same sums on every replica and run

-- counted returns what holder h accounts for at instant t: its rate and
-- burst, or the lowered grant's predecessor while that still counts.
local function counted(h, t)
  if t >= h.ends and t >= h.pend then
    return 0, 0
  end
  local r, b = 0, 0
  if t < h.ends then
    r, b = h.rate, h.burst
  end
  if t < h.pend then
    r, b = math.max(r, h.prate), math.max(b, h.pburst)
  end
  return r, b
end

-- totals returns what all holders account for at instant t.
local function totals(t)
  local r, b = 0, 0
  for _, id in ipairs(ids) do
    local hr, hb = counted(holders[id], t)
    r, b = r + hr, b + hb
  end
  return r, b
end

-- The rest's tokens, settled from `at` to now: between two instants where
-- a grant stops counting, the rest refills at the policy's rate less the
-- grants', up to the policy's burst less theirs.
local at = tonumber(state.at or now)
local tokens = tonumber(state.rest or burst)
if at < now then
  local marks = {}
  for _, id in ipairs(ids) do
    local h = holders[id]
    for _, m in ipairs({h.ends, h.pend}) do
      if m > at and m < now then
        marks[#marks + 1] = m
      end
    end
  end
  table.sort(marks)
  marks[#marks + 1] = now
  local from = at
  for _, to in ipairs(marks) do
    if to > from then
      local gr, gb = totals(from)
      local cap = math.max(0, burst - gb)
      tokens = math.min(cap, tokens + (to - from) * math.max(0, per_us - gr / 1000000))
      from = to
    end
  end
  at = now
end
-- Grants that no longer count are forgotten (by a call that writes).
for i = #ids, 1, -1 do
  local id = ids[i]
  local h = holders[id]
  if now >= h.ends and now >= h.pend then
    if mode ~= MODE_READ then
      redis.call('HDEL', key, 'h:' .. id)
    end
    holders[id] = nil
    table.remove(ids, i)
  end
end

-- rest_now returns the rest's rate (units per microsecond) and capacity.
local function rest_now()
  local gr, gb = totals(now)
  return math.max(0, per_us - gr / 1000000), math.max(0, burst - gb)
end

-- next_change returns the first instant after now where a grant stops
-- counting, or nil.
local function next_change()
  local first
  for _, id in ipairs(ids) do
    local h = holders[id]
    for _, m in ipairs({h.ends, h.pend}) do
      if m > now and (not first or m < first) then
        first = m
      end
    end
  end
  return first
end

-- The rest's demand: units asked of it, measured over at least a quarter
-- of a lease (a grant measures it).
local asked, since = tonumber(state.asked or 0), tonumber(state.since or now)
local want = tonumber(state.want or 0)

-- save writes the rest and sets the state's expiry: once every grant has
-- stopped counting and the rest has refilled to the full burst.
local function save()
  local last = now
  for _, id in ipairs(ids) do
    local h = holders[id]
    last = math.max(last, h.ends, h.pend)
  end
  local _, cap = rest_now()
  local refill = (burst - math.min(tokens, cap)) / per_us
  redis.call('HSET', key, 'at', int(now), 'rest', dec(tokens), 'asked', dec(asked), 'since', int(since), 'want', dec(want))
  redis.call('PEXPIRE', key, ttl_ms(last - now + refill + 1000000))
end

if mode == MODE_READ then
  local rr, rb = rest_now()
  local out = {now, dec(rr * 1000000), dec(rb), dec(math.min(tokens, rb)), dec(want)}
  for _, id in ipairs(ids) do
    local h = holders[id]
    local cr, cb = counted(h, now)
    for _, v in ipairs({id, dec(h.rate), dec(h.burst), h.ends, dec(cr), dec(cb), dec(h.demand)}) do
      out[#out + 1] = v
    end
  end
  return out
end

local blocked = blocked_for(KEYS[2], now)

if mode == MODE_TAKE_REST then
  local n = tonumber(ARGV[4])
  if ARGV[5] ~= '1' then
    asked = asked + n
  end
  local rr, cap = rest_now()
  tokens = math.min(tokens, cap)
  local allowed, retry = 0, 0
  if blocked > 0 then
    retry = blocked
  elseif tokens >= n then
    allowed, tokens = 1, tokens - n
  else
    -- When the rest refills enough before the next grant stops counting,
    -- then; else at that instant, to look again.
    local change = next_change()
    if cap >= n and rr > 0 then
      retry = math.ceil((n - tokens) / rr)
    end
    if change and (retry == 0 or now + retry > change) then
      retry = change - now
    end
    retry = math.max(1, retry)
  end
  save()
  return {allowed, math.floor(tokens), retry, now}
end

local id = ARGV[4]
local old = holders[id]

-- forget drops holder id's grant.
local function forget()
  redis.call('HDEL', key, 'h:' .. id)
  holders[id] = nil
  for i, v in ipairs(ids) do
    if v == id then
      table.remove(ids, i)
      break
    end
  end
end

if mode == MODE_RELEASE then
  if old then
    forget()
  end
  save()
  return {1, now}
end

-- MODE_GRANT. Every holder's demand and the rest's, shared out max-min
-- fairly: each gets what it wants up to an equal part of what is left.
local demand, lease, least = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
if now - since >= lease / 4 then
  want = asked * 1000000 / (now - since)
  asked, since = 0, now
end
local rest_want = want
local wants = {demand}
for _, other in ipairs(ids) do
  if other ~= id then
    wants[#wants + 1] = holders[other].demand
  end
end
if rest_want > 0 then
  wants[#wants + 1] = rest_want
end
table.sort(wants)
local left, fair = rate, rate
for i, w in ipairs(wants) do
  fair = left / (#wants - i + 1)
  if w >= fair then
    break
  end
  left = left - w
end
local target = math.min(demand, fair)
local total, holders_asking = 0, #wants
for _, w in ipairs(wants) do
  total = total + w
end
if rest_want > 0 then
  holders_asking = holders_asking - 1
end
-- While the key is wanted below its rate, what nobody wants is shared too:
-- each holder's share grows by an equal part of it (one part stays with
-- the rest, for newcomers), so that a demand growing between renewals,
-- such as that of decisions in memory, far faster than a round trip each,
-- finds room at once.
if total < rate then
  target = demand + (rate - total) / (holders_asking + 1)
end
-- While the key is wanted beyond its rate, a holder that wants less than
-- half an equal part gets no share: its small burst would fill and spill
-- between its arrivals, rate the others could have used. It asks the rest,
-- whose part covers its demand.
local small = total > rate and demand < fair / 2
if not small then
  -- Its requests of the rest while it asked for no share are its own
  -- demand from now on, no longer the rest's.
  asked = math.max(0, asked - tonumber(ARGV[8]))
end
-- What the others hold over the new lease (a lowered grant counts until
-- its old end) and the rest's fair part are not the holder's to take.
local others_rate, others_burst = 0, 0
for _, other in ipairs(ids) do
  if other ~= id then
    local r, b = counted(holders[other], now)
    others_rate, others_burst = others_rate + r, others_burst + b
  end
end
local rest_fair = math.min(rest_want, fair)
-- A newcomer to a key wanted beyond its rate gets at most an equal part
-- with one more party than now hold: other processes that started with
-- it, whose demand the rest has not measured yet, would otherwise wait a
-- lease for the first one's grant to stop counting.
if not old and total > rate then
  target = math.min(target, rate / (#ids + 2)) -- ids does not hold it yet
end
local free = rate - others_rate - rest_fair
if total < rate and not old then
  -- A newcomer gets at most half of what the others leave: their shares
  -- were sized before it came, and the rest must keep room for those
  -- still to come until the renewals bring all to equal parts.
  free = math.min(free, (rate - others_rate) / 2)
end
local new_rate = math.max(0, math.min(target, free))
-- The burst goes with the rate, but never below the least worth holding
-- while the others leave that much. While another party wants units and
-- has no burst (a holder granted nothing, or processes asking the rest),
-- the least stays with the rest: else a key whose burst is all held (a
-- burst of 1, say) would admit nobody else. Such a key ends up decided in
-- Redis, as without leases.
local keep = 0
if rest_want > 0 then
  keep = least
end
for _, other in ipairs(ids) do
  local o = holders[other]
  if other ~= id and o.demand > 0 and o.burst <= 0 then
    keep = least
  end
end
local new_burst = math.max(0, math.min(math.max(least, burst * new_rate / rate), burst - others_burst - keep))
if new_burst < least or new_rate <= 0 or small or blocked > 0 then
  new_rate, new_burst = 0, 0
end
-- A holder granted nothing stays for the lease with its demand, so that
-- the others' renewals leave it room; a small one leaves (its demand is
-- the rest's).
local ends, prate, pburst, pend = now + lease, 0, 0, 0
if small then
  ends = now
end
if old then
  -- What the holder may still decide under until the answer reaches it:
  -- its old grant until the old end, and the grant before that still
  -- counted; each kept only where it exceeds the new one.
  for _, g in ipairs({{old.rate, old.burst, old.ends}, {old.prate, old.pburst, old.pend}}) do
    if g[3] > now and (g[1] > new_rate or g[2] > new_burst) then
      prate, pburst, pend = math.max(prate, g[1]), math.max(pburst, g[2]), math.max(pend, g[3])
    end
  end
end
local h = {rate = new_rate, burst = new_burst, ends = ends, prate = prate, pburst = pburst, pend = pend, demand = demand}
if not old then
  ids[#ids + 1] = id
end
holders[id] = h
if ends > now or pend > now then
  redis.call('HSET', key, 'h:' .. id, table.concat({dec(new_rate), dec(new_burst), int(ends), dec(prate), dec(pburst), int(pend), dec(demand)}, ':'))
else
  forget()
end
-- Held below its part by the others' grants: the first instant one of
-- them stops counting (a lowered grant's old end, typically).
local again = 0
if not small and blocked == 0 and new_rate < target * 0.99 then
  for _, other in ipairs(ids) do
    if other ~= id then
      local o = holders[other]
      for _, m in ipairs({o.ends, o.pend}) do
        if m > now and (again == 0 or m - now < again) then
          again = m - now
        end
      end
    end
  end
end
-- The rest loses at once what the new grant takes from its capacity; its
-- tokens beyond its new capacity go with the grant (up to its burst), so
-- that a share starts with what the rest had saved rather than empty.
local _, cap = rest_now()
local given = 0
if new_rate > 0 and tokens > cap then
  given = math.min(new_burst, tokens - cap)
end
tokens = math.min(tokens, cap)
save()
local registered = 1
if small then
  registered = 0
end
return {dec(new_rate), dec(new_burst), ends - now, now, again, dec(given), registered}
