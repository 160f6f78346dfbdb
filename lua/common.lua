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

-- numeric_argv returns every ARGV converted to a number, in order.
local function numeric_argv()
  local values = {}
  for i = 1, #ARGV do
    values[i] = tonumber(ARGV[i])
  end
  return unpack(values)
end

-- server_now returns the Redis server's clock in microseconds.
local function server_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- floor_div returns floor(a / b) for integers a and b > 0, exactly, even where
-- the division a / b rounds to the neighbouring integer.
local function floor_div(a, b)
  local q = math.floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

-- ceil_div returns ceil(a / b) for integers a and b > 0.
local function ceil_div(a, b)
  return -floor_div(-a, b)
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

-- load_state reads a ':'-joined integer state; nil when the key is absent.
local function load_state(key)
  local raw = redis.call('GET', key)
  if not raw then
    return nil
  end
  local fields = {}
  for part in string.gmatch(raw, '[^:]+') do
    fields[#fields + 1] = tonumber(part)
  end
  return fields
end

-- store_state writes the integers joined by ':' with an expiry of ttl_us.
local function store_state(key, ttl_us, ...)
  local fields = {...}
  for i = 1, #fields do
    fields[i] = int(fields[i])
  end
  redis.call('SET', key, table.concat(fields, ':'), 'PX', ttl_ms(ttl_us))
end


-- Instants. The meters store one instant per key: a microsecond, plus a
-- remainder in ticks of 1/den microsecond when the rate's interval is not a
-- whole number of microseconds ("<us>" or "<us>:<ticks>").

-- ticks_until returns how many ticks from now until the instant stored at
-- key; 0 when it is absent or has passed.
local function ticks_until(key, now, den)
  local state = load_state(key)
  if state and state[1] >= now then
    return (state[1] - now) * den + (state[2] or 0)
  end
  return 0
end

-- store_instant stores the instant ticks after now, expiring when it comes.
local function store_instant(key, now, ticks, den)
  local whole = floor_div(ticks, den)
  local rest = ticks - whole * den
  if rest > 0 then
    store_state(key, ceil_div(ticks, den), now + whole, rest)
  else
    store_state(key, whole, now + whole)
  end
end
