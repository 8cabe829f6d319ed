-- Entry point. KEYS: every limit key of every check, in order. ARGV:
--   [1] now in µs, or '' to read Redis TIME (tests inject a clock here; an injected
--       clock also lengthens TTLs by an hour, since its time is not Redis's)
--   [2] '1' to charge, '0' to peek
--   [3] number of other regions whose published states aggregated limits count, then
--       each one's key suffix (':from:<region>': its states are at key .. suffix);
--   then the number of rules, then per rule: its number of limits, and per limit:
--       algorithm (1 fixed, 2 sliding window, 3 sliding log, 4 token bucket, 5 gcra;
--       6, a concurrency limit, is refused: hold.lua decides those),
--       limit, period (µs), burst, 1 when every charge counts (on_over_limit:
--       charge: a refused charge is taken too, into debt), else 0, and the number of
--       other regions it counts (0: regional; else as many as the suffixes, `sharing:
--       aggregate`) followed by each one's floor (the units it is taken to use at
--       least: its fallback share while its link is cut, else 0);
--   then per run of consecutive checks with the same rule and cost: the rule (1-based
--   index into those rules), the cost (negative: a refund of that many units, which
--   every limit gives back and none refuses), the number of checks in the run, and
--   the longest wait (µs) a refused check of a single limit may be admitted after
--   instead (max_delay, Rust `decide_delayed`: decided at now + its retry_after, and
--   answered allowed with that retry_after), 0 for none.
-- Checks are decided in order against a per-call state cache; nothing is written
-- until every check is decided. Returns one string: 5 little-endian doubles per limit,
--   allowed (1/0), remaining, reset_after, retry_after, used
-- (every number a decision holds is a double already; one string spares the client a
-- RESP frame per number, and costs Redis no more than the integers did).
local now, ttl_extra = script_clock(ARGV[1])
local commit = ARGV[2] == '1'
begin_call(#KEYS)

-- Every key's stored string, read up front with MGET (false where there is none, or
-- where the key holds another type: the same fresh state a GET's WRONGTYPE gave): one
-- Redis call for the whole batch instead of one GET per key, ~0.2 µs less per check
-- (redis-benchmark). In runs of keys: unpack() has a stack to fit them on.
do
  local chunk = 1000
  for first = 1, #KEYS, chunk do
    local last = math.min(first + chunk - 1, #KEYS)
    local values = redis.call('MGET', unpack(KEYS, first, last))
    -- Every index of this call set (nil past a short reply): `stored` is kept from call
    -- to call, and an entry left by an earlier one must never be read as this key's.
    for i = first, last do stored[i] = values[i - first + 1] end
  end
end

-- The rules of this call's checks, each listed once: the checks of a batch mostly
-- share a rule, so its numbers are sent and parsed once per call, not once per check.
-- Each rule's table, and each of its limits' quota, is the one an earlier call left
-- (see check_state.lua), filled in again.
local region_count = ARGV[3] + 0
for j = 1, region_count do suffixes[j] = ARGV[3 + j] end
local a = 4 + region_count
local rule_count = ARGV[a] + 0
a = a + 1
for r = 1, rule_count do
  local n = ARGV[a] + 0
  local rule = rules[r]
  if rule == nil then
    rule = { n = 0, kinds = {}, quotas = {}, algos = {}, invalid = {} }
    rules[r] = rule
  end
  local kinds, quotas, algos, invalid = rule.kinds, rule.quotas, rule.algos, rule.invalid
  for i = 1, n do
    local kind = ARGV[a + 1] + 0
    local q = quotas[i]
    if q == nil then
      q = {}
      quotas[i] = q
    end
    q.limit, q.period, q.burst = ARGV[a + 2] + 0, ARGV[a + 3] + 0, ARGV[a + 4] + 0
    q.debt = ARGV[a + 5] == '1'
    local algo = ALGOS[kind]
    -- Concurrency limits (6) are the hold script's, never decided here.
    if algo == nil then
      return redis.error_reply('sluice check: no algorithm ' .. ARGV[a + 1])
    end
    local regions = ARGV[a + 6] + 0
    if regions > 0 then
      if regions ~= region_count or not algo.remote_used then
        return redis.error_reply('sluice check: no aggregation of ' .. ARGV[a + 1] ..
          ' over ' .. ARGV[a + 6] .. ' regions')
      end
      local floors = q.floors or {}
      for j = 1, regions do floors[j] = ARGV[a + 6 + j] + 0 end
      q.floors = floors
    end
    q.regions = regions
    kinds[i], algos[i], invalid[i] = kind, algo, is_invalid_for(kind, q)
    a = a + 6 + regions
  end
  rule.n = n
  a = a + 1
end

local o = 0
local k = 1
-- Consecutive checks of one rule and cost come as one run: the rule, the cost, how
-- many checks, and the longest wait.
for c = a, #ARGV, 4 do
  local r = ARGV[c] + 0
  -- Past this call's rules, `rules` holds an earlier call's: never decided by.
  if not (r >= 1 and r <= rule_count) then
    return redis.error_reply('sluice check: rule ' .. ARGV[c] .. ' of ' .. rule_count)
  end
  local rule = rules[r]
  local cost = ARGV[c + 1] + 0
  local refund = cost < 0
  if refund then cost = -cost end
  local max_wait = ARGV[c + 3] + 0
  -- A peek never delays (a delay is a reservation).
  if refund or rule.n ~= 1 or not commit then max_wait = 0 end
  local n, kinds, quotas, algos, invalid = rule.n, rule.kinds, rule.quotas, rule.algos, rule.invalid
  for _ = 1, ARGV[c + 2] + 0 do
    local first = k
    k = k + n
    local all_allowed = true
    for i = 1, n do
      local kind, q, algo = kinds[i], quotas[i], algos[i]
      local index = first + i - 1
      local slot = load(KEYS[index], index, kind, now, q)
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
      -- An aggregated limit is decided under what the other regions leave of it (Rust
      -- `remote::decide_shared`); its state stays this region's own.
      local dq, taken, inv = q, 0, invalid[i]
      if q.regions > 0 then
        taken = others_taken(algo, KEYS[index], now, q)
        dq = shared_quota
        dq.limit, dq.period, dq.burst, dq.debt = sat_sub(q.limit, taken), q.period, q.burst, q.debt
        inv = is_invalid_for(kind, dq)
      end
      if inv then
        if refund then
          allowed, remaining, reset, retry, used = true, 0, 0, 0, 0
        else
          allowed, remaining, reset, retry, used = invalid_quota(cost, dq)
        end
        next, changed = state, false
      elseif refund then
        allowed, remaining, reset, retry, used, next, changed = algo.refund(state, now, cost, dq)
      else
        allowed, remaining, reset, retry, used, next, changed = algo.decide(state, now, cost, dq)
        if max_wait > 0 and algo.delays then
          if not allowed then
            if retry <= max_wait then
              local later = state
              if algo.advance then
                later = algo.advance(state, now + retry, q, KEYS[index], slot_orig[slot],
                  slot_foreign[slot])
                -- Redis holds what the call decided so far: a later write starts from it.
                slot_orig[slot], slot_foreign[slot] = later, false
              end
              allowed, remaining, reset, retry, used, next, changed = delayed(algo, state, later,
                now, cost, q, retry, allowed, remaining, reset, used, next, changed, KEYS[index])
            end
          elseif algo.dated and cost > 0 and next.newest > now then
            -- Behind a reservation the log dates this admission with it: answered then.
            retry = next.newest - now
            if retry > max_wait then
              allowed, remaining, next, changed = false, 0, state, false
            end
          end
        end
      end
      used = used + taken
      if not allowed then all_allowed = false end
      -- A committed decision over an expired state drops it, as the memory store does.
      if changed or expired then nexts[i] = next else nexts[i] = false end
      -- Packed here, one short string per limit: cheaper for Redis than a table of
      -- numbers packed at the end (~0.15 µs per check, redis-benchmark).
      o = o + 1
      out[o] = struct.pack('<ddddd', allowed and 1 or 0, remaining, reset, retry, used)
    end
    -- All-or-nothing; a single limit commits even when refused (fixed window counts
    -- refused hits, the others return no change, or their debt).
    -- Of several limits, a refusal still commits those whose every charge counts
    -- (on_over_limit: charge).
    if commit then
      local each = all_allowed or n == 1
      for i = 1, n do
        local next = nexts[i]
        if next and (each or quotas[i].debt) then
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
return table.concat(out, '', 1, o)
