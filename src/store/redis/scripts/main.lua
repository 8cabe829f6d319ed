-- Entry point. KEYS: every limit key of every check, in order. ARGV:
--   [1] now in µs, or '' to read Redis TIME (tests inject a clock here; an injected
--       clock also lengthens TTLs by an hour, since its time is not Redis's)
--   [2] '1' to charge, '0' to peek
--   [3] number of rules, then per rule: its number of limits, and per limit:
--       algorithm (1 fixed, 2 sliding window, 3 sliding log, 4 token bucket, 5 gcra),
--       limit, period (µs), burst;
--   then per check: its rule (1-based index into those rules) and its cost.
-- Checks are decided in order against a per-call state cache; nothing is written
-- until every check is decided. Returns 5 integers per limit:
--   allowed (1/0), remaining, reset_after, retry_after, used.
local now
local ttl_extra = 0
if ARGV[1] ~= '' then
  now = tonumber(ARGV[1])
  ttl_extra = 3600000
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local commit = ARGV[2] == '1'

-- key -> { kind, state, orig, foreign, dirty }
local cache = {}
local order = {}

local function load(key, kind)
  local entry = cache[key]
  if entry and entry.kind == kind then return entry end
  local algo = ALGOS[kind]
  local state, foreign
  if entry then
    -- Same key under another algorithm within one call: fresh, as in Rust.
    state, foreign = algo.fresh(), true
  elseif algo.load then
    state, foreign = algo.load(key)
  else
    local raw = redis.pcall('GET', key)
    state, foreign = nil, false
    if type(raw) == 'string' then
      state = algo.decode(raw)
    elseif type(raw) == 'table' then
      foreign = true
    end
    if state == nil then state = algo.fresh() end
  end
  entry = { kind = kind, state = state, orig = state, foreign = foreign, dirty = false }
  if cache[key] == nil then order[#order + 1] = key end
  cache[key] = entry
  return entry
end

-- The rules of this call's checks, each listed once: the checks of a batch mostly
-- share a rule, so its numbers are sent and parsed once per call, not once per check.
local rules = {}
local a = 4
for r = 1, tonumber(ARGV[3]) do
  local n = tonumber(ARGV[a])
  local kinds, quotas = {}, {}
  for i = 1, n do
    kinds[i] = tonumber(ARGV[a + 1])
    quotas[i] = { limit = tonumber(ARGV[a + 2]), period = tonumber(ARGV[a + 3]),
                  burst = tonumber(ARGV[a + 4]) }
    a = a + 4
  end
  rules[r] = { n = n, kinds = kinds, quotas = quotas }
  a = a + 1
end

local out = {}
local k = 1
local nexts = {}
for c = a, #ARGV, 2 do
  local rule = rules[tonumber(ARGV[c])]
  local cost = tonumber(ARGV[c + 1])
  local n, kinds, quotas = rule.n, rule.kinds, rule.quotas
  local first = k
  k = k + n
  for i = 1, n do nexts[i] = false end
  local all_allowed = true
  for i = 1, n do
    local kind, q = kinds[i], quotas[i]
    local entry = load(KEYS[first + i - 1], kind)
    local state = entry.state
    local algo = ALGOS[kind]
    -- A state past its expiry answers as fresh (the memory store's rule).
    local expired = has_expired(algo, state, now, q)
    if expired then state = algo.fresh() end
    local d, next, changed = algo.decide(state, now, cost, q)
    if not d[1] then all_allowed = false end
    -- A committed decision over an expired state drops it, as the memory store does.
    if changed or expired then nexts[i] = next end
    local o = #out
    local remaining, reset, retry, used = d[2], d[3], d[4], d[5]
    -- All four are ≥ 0: one test for the rare number past what a reply can carry.
    if remaining + reset + retry + used > REPLY_MAX then
      remaining, reset, retry, used =
        reply_int(remaining), reply_int(reset), reply_int(retry), reply_int(used)
    end
    out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5] =
      d[1] and 1 or 0, remaining, reset, retry, used
  end
  -- All-or-nothing; a single limit commits even when refused (fixed window counts
  -- refused hits, the others return no change).
  if commit and (all_allowed or n == 1) then
    for i = 1, n do
      if nexts[i] then
        local entry = cache[KEYS[first + i - 1]]
        entry.state = nexts[i]
        entry.dirty = true
        entry.q = quotas[i]
      end
    end
  end
end

for _, key in ipairs(order) do
  local entry = cache[key]
  if entry.dirty then
    local algo = ALGOS[entry.kind]
    local expires = algo.expires_at(entry.state, entry.q)
    if expires <= now then
      redis.call('DEL', key)
    else
      local ttl_ms = ceil((expires - now) / 1000) + ttl_extra
      if algo.store then
        algo.store(key, entry.orig, entry.foreign, entry.state, ttl_ms)
      else
        redis.call('SET', key, algo.encode(entry.state), 'PX', int(ttl_ms))
      end
    end
  end
end
return out
