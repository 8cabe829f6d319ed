-- Sluice: helpers shared by every algorithm (mirror of src/algorithm/mod.rs).
-- Numbers are doubles; every timestamp and count stays below 2^53, so integer
-- arithmetic here is exact, and each + - * / is one correctly rounded operation.
local floor, ceil, fmod = math.floor, math.ceil, math.fmod
local TWO53 = 9007199254740992

-- `x` rounded toward zero, NaN and negatives giving 0 (Rust `x as u64`).
local function to_u64(x)
  if x ~= x or x <= 0 then return 0 end
  return floor(x)
end

-- Rust `a.saturating_sub(b)` for integers.
local function sat_sub(a, b)
  if a > b then return a - b end
  return 0
end

-- Integer division and remainder, exact for integers below 2^53.
local function idiv(a, b)
  local r = fmod(a, b)
  return (a - r) / b, r
end

-- Smallest d with pass(d), for a monotone predicate (src/algorithm/mod.rs `earliest`).
-- Exact below 2^53; past it (times of a damaged state, or a huge cost) lo + 1 == lo in
-- doubles, and the bisection stops at a d that passes rather than spin forever.
local function earliest(guess, pass)
  local lo, hi, step = 0, guess, 1
  while not pass(hi) do
    if hi >= TWO53 then return hi end
    lo = hi + 1
    hi = hi + step
    step = step * 2
  end
  step = 1
  while hi > lo do
    local probe = hi - step
    if probe < lo then probe = lo end
    if pass(probe) then
      hi = probe
      step = step * 2
    else
      lo = probe + 1
      break
    end
  end
  while lo < hi do
    if lo >= TWO53 then return hi end
    local mid = lo + floor((hi - lo) / 2)
    if pass(mid) then hi = mid else lo = mid + 1 end
  end
  return hi
end

-- The largest double below 2^63. Redis turns a number a script returns into a C long
-- long, which a larger one (a count past 2^63, after a cost near u64::MAX) overflows:
-- such a number is returned as this instead.
local REPLY_MAX = 9223372036854774784

-- `x` as a script reply integer: at most REPLY_MAX.
local function reply_int(x)
  if x > REPLY_MAX then return REPLY_MAX end
  return x
end

-- Decision.invalid_quota, as the five values a decision is made of (see `decide` below).
local function invalid_quota(cost, q)
  local retry = q.period
  if retry < 1 then retry = 1 end
  return false, 0, 0, retry, cost
end

local function is_invalid(q)
  return q.limit == 0 or q.period == 0
end

-- Whether an algorithm of `kind` refuses `q` outright (invalid_quota): the fixed window
-- (kind 1) decides a limit of 0 as any other, as the reference does (every hit refused
-- and counted, reset at the window's end); only a period of 0 is invalid there.
local function is_invalid_for(kind, q)
  if kind == 1 then return q.period == 0 end
  return is_invalid(q)
end

-- Whether '%d' (a C long) prints `x` exactly: a whole number below 2^53 in magnitude.
-- It is much cheaper than '%.0f', which formats a double digit by digit; every state
-- field is such a number unless a cost near u64::MAX was charged.
local function small_int(x)
  return x % 1 == 0 and x < TWO53 and x > -TWO53
end

-- `a` and `b` formatted with `fast` (its fields '%d') when both are small integers, else
-- with `exact`, which prints any double exactly.
local function format_pair(fast, exact, a, b)
  if small_int(a) and small_int(b) then return string.format(fast, a, b) end
  return string.format(exact, a, b)
end

-- Encodes an integer exactly (tostring would print only 14 digits).
local function int(x)
  if small_int(x) then return string.format('%d', x) end
  return string.format('%.0f', x)
end

-- 2^64, the double u64::MAX rounds to: the memory store's u64 fields saturate there.
local U64_END = 18446744073709551616

-- `x` as a field of a stored state: nil when no state holds it (NaN, negative, infinite:
-- the value is damaged or not ours, and reads as fresh), else at most 2^64, as the
-- memory store's u64 fields saturate (a state written with a larger number, or damaged,
-- still decides as over the limit).
local function field(x)
  if not (x and x >= 0 and x < math.huge) then return nil end
  if x > U64_END then return U64_END end
  return x
end

-- The numbers `pattern` captures in `raw` (nil for a capture that is missing, not a
-- number, or not a number a state holds): a stored state is its algorithm's tag and its
-- fields, space separated (the token bucket's is binary, see token_bucket.lua).
local function numbers(raw, pattern)
  local a, b, c = string.match(raw, pattern)
  return field(tonumber(a)), field(tonumber(b)), field(tonumber(c))
end

-- Every algorithm has fresh (a new empty state), decide and expires_at; one with a
-- string state has decode (the stored string to a state, nil when it is not this
-- algorithm's) and encode (a state to the string stored). decide(s, now, cost, q), for a
-- valid quota (the caller answers an invalid one with invalid_quota), returns seven
-- values: allowed, remaining, reset_after, retry_after, used, the next state and whether
-- it changed; it never changes `s` in place (a changed state is a new table).
--
-- ALGOS[kind] is made on first use: a script's body runs on every EVALSHA, and making
-- all five algorithms' tables and closures on every call cost Redis ~1.5 µs more than
-- making the one a call typically uses (redis-benchmark, one check per call:
-- 16.6–17.7 → 15.5–16.0 µs). In the function library (FCALL) the body runs once per
-- node, and each algorithm is made once.
-- Each algorithm's file sets MAKE_ALGO[kind]; a kind with none is nil.
local MAKE_ALGO = {}
local ALGOS = setmetatable({}, {
  __index = function(algos, kind)
    local make = MAKE_ALGO[kind]
    if make == nil then return nil end
    local algo = make()
    rawset(algos, kind, algo)
    return algo
  end,
})

-- A refused charge admitted after `wait` instead (Rust `decide_delayed`, for the
-- algorithms marked `delays`): decided at now + wait over `later`, the state read now
-- (`state`), or as read again then by the algorithm's `advance` when its state is a
-- summary of one instant (the sliding log's; the caller has written the call's changes
-- so far). Returns the seven values of a decision (retry_after the wait, reset_after
-- from now), or the refusal given when even then it is not admitted (a cost above the
-- capacity): for an advanced state, with the log as it reads now at `key`.
local function delayed(algo, state, later, now, cost, q, wait, allowed, remaining, reset, used, next, changed, key)
  local a2, r2, reset2, _, u2, n2, c2 = algo.decide(later, now + wait, cost, q)
  if not a2 then
    if later ~= state then
      return allowed, remaining, reset, wait, used, (algo.load(key, now, q)), true
    end
    return allowed, remaining, reset, wait, used, next, changed
  end
  return true, r2, reset2 + wait, wait, u2, n2, c2
end

-- Whether `state` has expired at `now` (a state past its expiry answers as fresh, the
-- memory store's rule): an algorithm's `expired` when it has one, a cheaper test than
-- working out when the state expires. main.lua's per-check loop writes this out (a
-- Lua call per check is ~0.1 µs of Redis): change both together.
local function has_expired(algo, state, now, q)
  if algo.expired then return algo.expired(state, now, q) end
  return algo.expires_at(state, q) <= now
end

-- The script's clock and how much longer its TTLs are: `injected` µs when not '' (tests
-- inject a clock; its time is not Redis's, so TTLs get an hour more), else Redis TIME.
-- Strings become numbers by arithmetic here, as the entry points read their numeric
-- arguments: tonumber() converts its string twice (one strtod to test, one to convert),
-- `s + 0` once, and strtod was a tenth of a one-check call's cost (callgrind).
local function script_clock(injected)
  if injected ~= '' then return injected + 0, 3600000 end
  local t = redis.call('TIME')
  return t[1] * 1000000 + t[2], 0
end

-- TTLs already formatted, by number of milliseconds (one per distinct TTL). In the
-- function library (see src/store/redis/functions.rs) these helpers outlive a call, and
-- so does this table: it is emptied when it holds TTL_TEXTS_KEPT of them, so it never
-- grows with every distinct TTL.
local ttl_texts, ttl_count = {}, 0
local TTL_TEXTS_KEPT = 256

-- Writes `state`, decided under `q`, to `key` with a TTL to its expiry (plus
-- `ttl_extra` ms), or deletes the key when the state has expired at `now`. The expiry is
-- at most 2^64 µs, where the memory store's u64 expiry saturates: a time past it (a huge
-- cost, a damaged state) gave a TTL Redis refuses, failing the whole call. An algorithm
-- that stores itself gets its state as loaded (`orig`) and whether Redis held another
-- type there (`foreign`).
local function write_state(key, algo, state, q, now, ttl_extra, orig, foreign)
  local expires = algo.expires_at(state, q)
  if expires > U64_END then expires = U64_END end
  if expires <= now then
    redis.call('DEL', key)
    return
  end
  local ttl_ms = ceil((expires - now) / 1000) + ttl_extra
  if algo.store then
    algo.store(key, orig, foreign, state, ttl_ms)
  else
    -- States mostly share a few TTLs: each is formatted once.
    local text = ttl_texts[ttl_ms]
    if text == nil then
      text = int(ttl_ms)
      if ttl_count >= TTL_TEXTS_KEPT then ttl_texts, ttl_count = {}, 0 end
      ttl_texts[ttl_ms], ttl_count = text, ttl_count + 1
    end
    redis.call('SET', key, algo.encode(state), 'PX', text)
  end
end
