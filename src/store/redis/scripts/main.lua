-- Entry point. KEYS: every limit key of every check, in order. ARGV:
--   [1] now in µs, or '' to read Redis TIME (tests inject a clock here; an injected
--       clock also lengthens TTLs by an hour, since its time is not Redis's)
--   [2] '1' to charge, '0' to peek
--   [3] number of rules, then per rule: its number of limits, and per limit:
--       algorithm (1 fixed, 2 sliding window, 3 sliding log, 4 token bucket, 5 gcra),
--       limit, period (µs), burst;
--   then per run of consecutive checks with the same rule and cost: the rule (1-based
--   index into those rules), the cost, and the number of checks in the run.
-- Checks are decided in order against a per-call state cache; nothing is written
-- until every check is decided. Returns one string: 5 little-endian doubles per limit,
--   allowed (1/0), remaining, reset_after, retry_after, used
-- (every number a decision holds is a double already; one string spares the client a
-- RESP frame per number, and costs Redis no more than the integers did).
local now, ttl_extra = script_clock(ARGV[1])
ttl_texts = {}
local commit = ARGV[2] == '1'

-- Every distinct key of this call has a slot, numbered in first-seen order; per slot:
-- its key, algorithm, current state, state as loaded, whether Redis holds another type
-- there (known to an algorithm that reads its own key, see sliding_log.lua), and, once
-- a committed decision changed it, the quota it was decided under (set: the state is
-- to be written). Parallel arrays: no table per key.
local slot_of = {}
local slot_key, slot_kind, slot_state, slot_orig, slot_foreign, slot_quota = {}, {}, {}, {}, {}, {}
local slots = 0

-- One fresh state per algorithm for the whole call: nothing in this script changes a
-- state in place (a decision that changes one returns a new table).
-- The per-check loop reads `fresh_of[kind]` itself before calling this.
local fresh_of = {}
local function fresh(kind)
  local state = fresh_of[kind]
  if state == nil then
    state = ALGOS[kind].fresh()
    fresh_of[kind] = state
  end
  return state
end

-- Every key's stored string, read up front with MGET (false where there is none, or
-- where the key holds another type: the same fresh state a GET's WRONGTYPE gave): one
-- Redis call for the whole batch instead of one GET per key, ~0.2 µs less per check
-- (redis-benchmark). In runs of keys: unpack() has a stack to fit them on.
local stored = {}
do
  local chunk = 1000
  for first = 1, #KEYS, chunk do
    local last = math.min(first + chunk - 1, #KEYS)
    local values = redis.call('MGET', unpack(KEYS, first, last))
    for i = 1, #values do stored[first + i - 1] = values[i] end
  end
end

-- The slot of KEYS[index] under algorithm `kind`, its state read on first use.
local function load(index, kind)
  local key = KEYS[index]
  local slot = slot_of[key]
  if slot and slot_kind[slot] == kind then return slot end
  local algo = ALGOS[kind]
  local state, foreign
  if slot then
    -- Same key under another algorithm within one call: fresh, as in Rust.
    state, foreign = fresh(kind), true
  elseif algo.load then
    state, foreign = algo.load(key)
  else
    local raw = stored[index]
    foreign = false
    if raw then state = algo.decode(raw) end
    if state == nil then state = fresh_of[kind] or fresh(kind) end
  end
  if slot == nil then
    slots = slots + 1
    slot = slots
    slot_of[key] = slot
    slot_key[slot] = key
  end
  slot_kind[slot], slot_state[slot], slot_orig[slot] = kind, state, state
  slot_foreign[slot], slot_quota[slot] = foreign, nil
  return slot
end

-- The rules of this call's checks, each listed once: the checks of a batch mostly
-- share a rule, so its numbers are sent and parsed once per call, not once per check.
local rules = {}
local a = 4
for r = 1, tonumber(ARGV[3]) do
  local n = tonumber(ARGV[a])
  local kinds, quotas, algos, invalid = {}, {}, {}, {}
  for i = 1, n do
    local kind = tonumber(ARGV[a + 1])
    local q = { limit = tonumber(ARGV[a + 2]), period = tonumber(ARGV[a + 3]),
                burst = tonumber(ARGV[a + 4]) }
    kinds[i], quotas[i], algos[i], invalid[i] = kind, q, ALGOS[kind], is_invalid(q)
    a = a + 4
  end
  rules[r] = { n = n, kinds = kinds, quotas = quotas, algos = algos, invalid = invalid }
  a = a + 1
end

local out = {}
local o = 0
-- Per limit of the check being decided: its next state (false: none to keep) and slot.
local nexts, slot_at = {}, {}
local k = 1
-- Consecutive checks of one rule and cost come as one run: the rule, the cost, and
-- how many checks.
for c = a, #ARGV, 3 do
  local rule = rules[tonumber(ARGV[c])]
  local cost = tonumber(ARGV[c + 1])
  local n, kinds, quotas, algos, invalid = rule.n, rule.kinds, rule.quotas, rule.algos, rule.invalid
  for _ = 1, tonumber(ARGV[c + 2]) do
    local first = k
    k = k + n
    local all_allowed = true
    for i = 1, n do
      local kind, q, algo = kinds[i], quotas[i], algos[i]
      local slot = load(first + i - 1, kind)
      slot_at[i] = slot
      local state = slot_state[slot]
      -- A state past its expiry answers as fresh (the memory store's rule); has_expired
      -- written out, one call fewer per check.
      local expired
      if algo.expired then
        expired = algo.expired(state, now, q)
      else
        expired = algo.expires_at(state, q) <= now
      end
      if expired then state = fresh_of[kind] or fresh(kind) end
      local allowed, remaining, reset, retry, used, next, changed
      if invalid[i] then
        allowed, remaining, reset, retry, used = invalid_quota(cost, q)
        next, changed = state, false
      else
        allowed, remaining, reset, retry, used, next, changed = algo.decide(state, now, cost, q)
      end
      if not allowed then all_allowed = false end
      -- A committed decision over an expired state drops it, as the memory store does.
      if changed or expired then nexts[i] = next else nexts[i] = false end
      -- Packed here, one short string per limit: cheaper for Redis than a table of
      -- numbers packed at the end (~0.15 µs per check, redis-benchmark).
      o = o + 1
      out[o] = struct.pack('<ddddd', allowed and 1 or 0, remaining, reset, retry, used)
    end
    -- All-or-nothing; a single limit commits even when refused (fixed window counts
    -- refused hits, the others return no change).
    if commit and (all_allowed or n == 1) then
      for i = 1, n do
        local next = nexts[i]
        if next then
          local slot = slot_at[i]
          slot_state[slot], slot_quota[slot] = next, quotas[i]
        end
      end
    end
  end
end

for slot = 1, slots do
  local q = slot_quota[slot]
  if q then
    write_state(slot_key[slot], ALGOS[slot_kind[slot]], slot_state[slot], q, now,
      ttl_extra, slot_orig[slot], slot_foreign[slot])
  end
end
return table.concat(out)
