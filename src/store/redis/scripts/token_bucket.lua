-- Token bucket (mirror of src/algorithm/token_bucket.rs). State: {deficit, last}.
-- Stored as 17 bytes: 'T' and both numbers as little-endian doubles (exact). The deficit
-- is nearly always fractional, and formatting it as text ('%.17g', digit by digit) and
-- parsing it back cost ~1 µs of Redis per check; the text form 't <deficit> <last>' of
-- earlier versions is still read.
local function tb_deficit_at(s, now, q)
  -- sat_sub(now, s.last) inline (a NaN read from a damaged state also gives 0).
  local elapsed = now - s.last
  if not (elapsed > 0) then elapsed = 0 end
  local deficit = s.deficit - elapsed * q.limit / q.period
  if deficit < 0 then deficit = 0 end
  return deficit
end

local function tb_fits(deficit, cost, q)
  return deficit + cost <= q.burst
end

local function tb_guess(s, now, tokens, q)
  local skew = sat_sub(s.last, now)
  local wait = ceil(tokens * q.period / q.limit)
  return skew + to_u64(wait)
end

-- Smallest d at which the deficit of `s` is gone at `from + d`: earliest() from the
-- guess for `tokens`, with its first two probes (the guess, then one less) made inline
-- first, since the guess is nearly always the answer; a closure only when it is not.
-- Same probes, same order: the same answer as earliest() alone. Every check comes here,
-- so tb_guess and tb_deficit_at are written out on numbers (a Lua call costs about as
-- much as the arithmetic it wraps): the same operations in the same order.
local function tb_drained_after(s, from, tokens, q)
  local limit, period, deficit, last = q.limit, q.period, s.deficit, s.last
  local skew = last - from
  if not (last > from) then skew = 0 end
  -- to_u64(ceil(x)): ceil's result is whole already.
  local wait = ceil(tokens * period / limit)
  if wait ~= wait or wait <= 0 then wait = 0 end
  local guess = skew + wait
  local elapsed = (from + guess) - last
  if not (elapsed > 0) then elapsed = 0 end
  if deficit - elapsed * limit / period <= 0 then
    if guess == 0 then return guess end
    elapsed = (from + guess - 1) - last
    if not (elapsed > 0) then elapsed = 0 end
    if deficit - elapsed * limit / period > 0 then return guess end
  end
  return earliest(guess, function(d)
    return tb_deficit_at(s, from + d, q) <= 0
  end)
end

MAKE_ALGO[4] = function() return {
  -- A refused request can be admitted later (max_delay, Rust AlgorithmKind::delays).
  delays = true,
  fresh = function() return { deficit = 0, last = 0 } end,
  decode = function(raw)
    local deficit, last
    if #raw == 17 and string.byte(raw, 1) == 84 then -- 'T'
      local _
      _, deficit, last = struct.unpack('<c1dd', raw)
      deficit, last = field(deficit), field(last)
    else
      deficit, last = numbers(raw, '^t (%S+) (%S+)$')
    end
    if deficit and last then return { deficit = deficit, last = last } end
  end,
  encode = function(s) return struct.pack('<c1dd', 'T', s.deficit, s.last) end,
  decide = function(s, now, cost, q)
    -- tb_deficit_at(s, now, q) and tb_fits, written out (see tb_drained_after).
    local s_last = s.last
    local elapsed = now - s_last
    if not (elapsed > 0) then elapsed = 0 end
    local deficit = s.deficit - elapsed * q.limit / q.period
    if deficit < 0 then deficit = 0 end
    local allowed = deficit + cost <= q.burst
    local next, changed = s, false
    -- Debt (on_over_limit: charge): a refused charge is taken too.
    if (allowed or q.debt) and cost > 0 then
      local last = now
      if s_last > last then last = s_last end
      -- Every field it may get, set now: a field added later grows the table.
      next, changed = { deficit = deficit + cost, last = last, expires = false, expires_q = false },
        true
    end
    local retry = 0
    if not allowed then
      if cost > q.burst then
        local fill = q.burst * q.period / q.limit
        retry = to_u64(ceil(fill))
        if retry < 1 then retry = 1 end
      else
        -- Against the state the decision leaves (Rust: `basis`).
        local basis, basis_deficit = s, deficit
        if changed then basis, basis_deficit = next, next.deficit end
        local missing = basis_deficit + cost - q.burst
        retry = earliest(tb_guess(basis, now, missing, q), function(d)
          return tb_fits(tb_deficit_at(basis, now + d, q), cost, q)
        end)
      end
    end
    local deficit_after = deficit
    if changed then deficit_after = next.deficit end
    local reset_after = tb_drained_after(next, now, deficit_after, q)
    -- A charged state dated now expires after exactly reset_after: expires_at() would
    -- make the same call again when the state is written, so it reads this instead.
    if changed and next.last == now then next.expires, next.expires_q = now + reset_after, q end
    -- to_u64(floor(x)) and to_u64(ceil(x)): both results are whole already.
    local remaining = 0
    if allowed then
      remaining = floor(q.burst - deficit_after)
      if remaining ~= remaining or remaining <= 0 then remaining = 0 end
    end
    local used = ceil(deficit + cost)
    if used ~= used or used <= 0 then used = 0 end
    return allowed, remaining, reset_after, retry, used, next, changed
  end,
  -- Puts `n` tokens back, never above the burst (Rust `refund`).
  refund = function(s, now, n, q)
    local deficit = tb_deficit_at(s, now, q)
    local after = deficit - n
    if after < 0 then after = 0 end
    local next, changed = s, false
    if n > 0 and deficit > 0 then
      local last = now
      if s.last > last then last = s.last end
      next, changed = { deficit = after, last = last, expires = false, expires_q = false }, true
    end
    local reset_after = tb_drained_after(next, now, after, q)
    return true, to_u64(floor(q.burst - after)), reset_after, 0, to_u64(ceil(after)), next,
      changed
  end,
  expires_at = function(s, q)
    if s.expires_q == q then return s.expires end
    if s.deficit <= 0 or is_invalid(q) then return s.last end
    return s.last + tb_drained_after(s, s.last, s.deficit, q)
  end,
  -- expires_at(s, q) <= now, without working out when: the deficit drains at the first
  -- instant its remainder is 0, and the remainder only falls with time, so that instant
  -- is past exactly when the remainder at `now` is 0 (half the cost of expires_at here).
  expired = function(s, now, q)
    if s.deficit <= 0 or is_invalid(q) then return s.last <= now end
    if now < s.last then return false end
    return tb_deficit_at(s, now, q) <= 0
  end,
} end
