-- Token leasing entry point (DESIGN §6, layer 3), joined after the algorithm files in
-- place of main.lua. One limit (a leased rule has exactly one), one key:
-- KEYS[1] the limit key. ARGV:
--   [1] now in µs, or '' to read Redis TIME
--   [2] algorithm (1 fixed window, 2 sliding window, 4 token bucket, 5 gcra;
--       the sliding log cannot lease and is refused)
--   [3] limit [4] period (µs) [5] burst
--   [6] cost of the request to decide now (0: none, a pure return)
--   [7] units to lease if the request is admitted (0: none)
--   [8] unused units of the previous lease to return (0: none)
--   [9] store time at which that lease was granted
--  [10] lifetime L of the new lease in µs (token bucket and GCRA reserve L's refill)
--  [11] lifetime of the returned lease
-- In order: return the unused units (only what is safe, see below), decide the request
-- exactly as main.lua would, then, if admitted, take the lease all-or-nothing.
-- Returns 8 integers: the request's decision (allowed, remaining, reset_after,
-- retry_after, used), units granted, the store's now, and µs left in the current
-- window (fixed and sliding window; 0 for the others).
local now, ttl_extra = script_clock(ARGV[1])
local key = KEYS[1]
local kind = ARGV[2] + 0
local q = { limit = ARGV[3] + 0, period = ARGV[4] + 0,
            burst = ARGV[5] + 0 }
local cost = ARGV[6] + 0
local units = ARGV[7] + 0
local unused = ARGV[8] + 0
local granted_at = ARGV[9] + 0
local lifetime = ARGV[10] + 0
local returned_lifetime = ARGV[11] + 0
local algo = ALGOS[kind]
if algo == nil or kind == 3 then
  return redis.error_reply('sluice lease: algorithm ' .. tostring(kind) .. ' cannot lease')
end
if is_invalid_for(kind, q) then
  local _, remaining, reset, retry, used = invalid_quota(cost, q)
  return { 0, reply_int(remaining), reply_int(reset), reply_int(retry), reply_int(used), 0, now, 0 }
end

-- Load (tagged string states only: every leasable algorithm stores one).
local state = nil
local raw = redis.pcall('GET', key)
if type(raw) == 'string' then state = algo.decode(raw) end
if state == nil or has_expired(algo, state, now, q) then state = algo.fresh() end
local dirty = false

-- 1. Return unused units. Windows: exact, from the counter of the window that holds
-- them. Token bucket and GCRA: the lease charged its units plus the refill of its
-- lifetime (a reserve, since leased units are used up to L after they are charged);
-- a charge of X units at t0 still weighs at least X - rate * (now - t0) at now, so that
-- much can be given back without ever exceeding what a never-charged bucket would hold.
if unused > 0 then
  local elapsed = sat_sub(now, granted_at)
  if kind == 1 then
    local lease_ws = granted_at - fmod(granted_at, q.period)
    if state.ws == lease_ws then
      state.count = sat_sub(state.count, unused)
      dirty = true
    end
  elseif kind == 2 then
    local lease_ws = granted_at - fmod(granted_at, q.period)
    if state.ws == lease_ws then
      state.curr = sat_sub(state.curr, unused)
      dirty = true
    elseif state.ws == lease_ws + q.period then
      state.prev = sat_sub(state.prev, unused)
      dirty = true
    end
  elseif kind == 4 then
    local rate = q.limit / q.period
    local reserve = sat_sub(returned_lifetime, elapsed) * rate
    local back = unused + reserve - elapsed * rate
    if back > 0 then
      local deficit = tb_deficit_at(state, now, q) - back
      if deficit < 0 then deficit = 0 end
      local last = now
      if state.last > last then last = state.last end
      state = { deficit = deficit, last = last }
      dirty = true
    end
  elseif kind == 5 then
    local per = mx_intervals(unused, q)
    local back = per.us + sat_sub(returned_lifetime, elapsed) - elapsed
    if back > 0 then
      local tat = mx_sub(gcra_tat_of(state, q), { us = back, frac = 0 }, q)
      state = { tat = tat.us, frac = tat.frac }
      dirty = true
    end
  end
end

-- 2. The request itself, exactly as main.lua decides a single limit.
local d = { 1, 0, 0, 0, 0 }
if cost > 0 then
  local allowed, remaining, reset, retry, used, next, changed = algo.decide(state, now, cost, q)
  d = { allowed and 1 or 0, remaining, reset, retry, used }
  if changed then state = next; dirty = true end
end

-- 3. The lease, all-or-nothing; a refused lease charges nothing (even a fixed window).
local granted = 0
if units > 0 and d[1] == 1 then
  if kind == 1 or kind == 2 then
    local admitted, _, _, _, _, next, changed = algo.decide(state, now, units, q)
    if admitted and changed then state = next; granted = units; dirty = true end
  elseif kind == 4 then
    local reserve = lifetime * q.limit / q.period
    local admitted, _, _, _, _, next, changed = algo.decide(state, now, units + reserve, q)
    if admitted and changed then state = next; granted = units; dirty = true end
  elseif kind == 5 then
    local admitted, _, _, _, _, next, changed = algo.decide(state, now, units, q)
    if admitted and changed then
      local tat = mx_add(gcra_tat_of(next, q), { us = lifetime, frac = 0 }, q)
      local ahead = mx_sub(tat, { us = now, frac = 0 }, q)
      if mx_le(ahead, mx_intervals(q.burst, q)) then
        state = { tat = tat.us, frac = tat.frac }
        granted = units
        dirty = true
      end
    end
  end
end

-- No leasing algorithm stores itself (the sliding log cannot lease).
if dirty then write_state(key, algo, state, q, now, ttl_extra) end

local window_left = 0
if kind == 1 or kind == 2 then window_left = q.period - fmod(now, q.period) end
return { d[1], reply_int(d[2]), reply_int(d[3]), reply_int(d[4]), reply_int(d[5]),
         reply_int(granted), now, window_left }
