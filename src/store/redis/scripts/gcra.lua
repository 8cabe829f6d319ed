-- GCRA (mirror of src/algorithm/gcra.rs). State: {tat, frac}: the TAT in mixed radix
-- `tat + frac / limit` microseconds; every intermediate is an integer below 2^53.
local function mx_intervals(n, q)
  local qq, r = idiv(q.period, q.limit)
  local nr = n * r
  local whole, frac = idiv(nr, q.limit)
  return { us = n * qq + whole, frac = frac }
end

local function mx_add(a, b, q)
  local frac = a.frac + b.frac
  local carry = 0
  if frac >= q.limit then carry = 1; frac = frac - q.limit end
  return { us = a.us + b.us + carry, frac = frac }
end

local function mx_le(a, b)
  return a.us < b.us or (a.us == b.us and a.frac <= b.frac)
end

local function mx_sub(a, b, q)
  if mx_le(a, b) then return { us = 0, frac = 0 } end
  if a.frac >= b.frac then return { us = a.us - b.us, frac = a.frac - b.frac } end
  return { us = a.us - b.us - 1, frac = a.frac + (q.limit - b.frac) }
end

local function mx_ceil(a)
  if a.frac > 0 then return a.us + 1 end
  return a.us
end

local function mx_in_intervals(a, q)
  return (a.us * q.limit + a.frac) / q.period
end

local function gcra_tat_of(s, q)
  local whole, frac = idiv(s.frac, q.limit)
  return { us = s.tat + whole, frac = frac }
end

MAKE_ALGO[5] = function() return {
  -- A refused request can be admitted later (max_delay, Rust AlgorithmKind::delays).
  delays = true,
  fresh = function() return { tat = 0, frac = 0 } end,
  decode = function(raw)
    local tat, frac = numbers(raw, '^g (%S+) (%S+)$')
    if tat and frac then return { tat = tat, frac = frac } end
  end,
  encode = function(s) return format_pair('g %d %d', 'g %.0f %.0f', s.tat, s.frac) end,
  decide = function(s, now, cost, q)
    local now_m = { us = now, frac = 0 }
    local tat = gcra_tat_of(s, q)
    local base = tat
    if mx_le(tat, now_m) then base = now_m end
    local tau = mx_intervals(q.burst, q)
    local new_tat = mx_add(base, mx_intervals(cost, q), q)
    if cost > q.burst then
      local ahead = mx_in_intervals(mx_sub(base, now_m, q), q)
      local retry = mx_ceil(tau)
      if retry < 1 then retry = 1 end
      -- Debt (on_over_limit: charge): even a cost that can never pass is taken.
      local next, kept, changed = s, base, false
      if q.debt then
        next, kept, changed = { tat = new_tat.us, frac = new_tat.frac }, new_tat, true
      end
      return false, 0, mx_ceil(mx_sub(kept, now_m, q)), retry, to_u64(ceil(ahead + cost)), next,
        changed
    end
    local ahead = mx_sub(new_tat, now_m, q)
    local allowed = mx_le(ahead, tau)
    local units_ahead = mx_in_intervals(ahead, q)
    local next, kept, changed = s, base, false
    if (allowed or q.debt) and cost > 0 then
      next, kept, changed = { tat = new_tat.us, frac = new_tat.frac }, new_tat, true
    end
    local remaining, retry = 0, 0
    if allowed then
      remaining = to_u64(floor(q.burst - units_ahead))
    elseif changed then
      -- The same request again, after this one's charge.
      retry = mx_ceil(mx_sub(mx_add(ahead, mx_intervals(cost, q), q), tau, q))
    else
      retry = mx_ceil(mx_sub(ahead, tau, q))
    end
    return allowed, remaining, mx_ceil(mx_sub(kept, now_m, q)), retry, to_u64(ceil(units_ahead)),
      next, changed
  end,
  -- Moves the TAT back by n intervals, never before now (Rust `refund`).
  refund = function(s, now, n, q)
    local now_m = { us = now, frac = 0 }
    local tat = gcra_tat_of(s, q)
    local back = mx_sub(tat, mx_intervals(n, q), q)
    if mx_le(back, now_m) then back = now_m end
    local next, kept, changed = s, tat, false
    if not mx_le(tat, back) then
      next, kept, changed = { tat = back.us, frac = back.frac }, back, true
    elseif mx_le(tat, now_m) then
      kept = now_m
    end
    local ahead = mx_sub(kept, now_m, q)
    local units_ahead = mx_in_intervals(ahead, q)
    return true, to_u64(floor(q.burst - units_ahead)), mx_ceil(ahead), 0,
      to_u64(ceil(units_ahead)), next, changed
  end,
  expires_at = function(s, q)
    if is_invalid(q) then return s.tat end
    return mx_ceil(gcra_tat_of(s, q))
  end,
} end
