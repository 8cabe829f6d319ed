-- Entry point. KEYS: every limit key of every check, in order. ARGV:
--   [1] now in µs, or '' to read Redis TIME (tests inject a clock here; an injected
--       clock also lengthens TTLs by an hour, since its time is not Redis's)
--   [2] '1' to charge, '0' to peek
--   [3] number of checks, then per check: cost, number of limits, and per limit:
--       algorithm (1 fixed, 2 sliding window, 3 sliding log, 4 token bucket, 5 gcra),
--       limit, period (µs), burst, stop_increment_when_over_limit ('1'/'0').
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
local checks = tonumber(ARGV[3])

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
      local fields = {}
      for word in string.gmatch(raw, '%S+') do fields[#fields + 1] = word end
      if fields[1] == algo.tag then
        table.remove(fields, 1)
        state = algo.decode(fields)
      end
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

local out = {}
local a, k = 4, 1
for _ = 1, checks do
  local cost = tonumber(ARGV[a])
  local n = tonumber(ARGV[a + 1])
  a = a + 2
  local limits = {}
  for i = 1, n do
    limits[i] = {
      key = KEYS[k], kind = tonumber(ARGV[a]),
      q = { limit = tonumber(ARGV[a + 1]), period = tonumber(ARGV[a + 2]),
            burst = tonumber(ARGV[a + 3]), stop = ARGV[a + 4] == '1' },
    }
    a = a + 5
    k = k + 1
  end
  local nexts, all_allowed = {}, true
  for i, l in ipairs(limits) do
    local entry = load(l.key, l.kind)
    local state = entry.state
    local algo = ALGOS[l.kind]
    -- A state past its expiry answers as fresh (the memory store's rule).
    local expired = algo.expires_at(state, l.q) <= now
    if expired then state = algo.fresh() end
    local d, next, changed = algo.decide(state, now, cost, l.q)
    if not d[1] then all_allowed = false end
    -- A committed decision over an expired state drops it, as the memory store does.
    if changed or expired then nexts[i] = next end
    out[#out + 1] = d[1] and 1 or 0
    for j = 2, 5 do out[#out + 1] = d[j] end
  end
  -- All-or-nothing; a single limit commits even when refused (fixed window counts
  -- refused hits, the others return no change).
  if commit and (all_allowed or n == 1) then
    for i, l in ipairs(limits) do
      if nexts[i] then
        local entry = cache[l.key]
        entry.state = nexts[i]
        entry.dirty = true
        entry.q = l.q
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
        redis.call('SET', key, algo.tag .. ' ' .. algo.encode(entry.state), 'PX', ttl_ms)
      end
    end
  end
end
return out
