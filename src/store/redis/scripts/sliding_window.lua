-- Sliding window counter (mirror of src/algorithm/sliding_window.rs).
-- State: {ws, prev, curr}.
local function sw_assess(s, at, cost, q)
  local period = q.period
  local ws = at - fmod(at, period)
  local prev, curr = 0, 0
  if ws <= s.ws then
    prev, curr = s.prev, s.curr
  elseif q.debt then
    -- Each window passes `limit` on and carries the rest (Rust `assess`).
    local windows = idiv(ws - s.ws, period)
    if windows < 1 then windows = 1 end
    prev = sat_sub(s.curr, q.limit * (windows - 1))
    if prev > q.limit then prev = q.limit end
    curr = sat_sub(s.curr, q.limit * windows)
  elseif ws == s.ws + period then
    prev, curr = s.curr, 0
  end
  local elapsed = at - ws
  local weight = (period - elapsed) / period
  local estimate = prev * weight + curr
  local needed = estimate + cost
  return { ws = ws, prev = prev, curr = curr, elapsed = elapsed, needed = needed,
           allowed = needed <= q.limit }
end

-- Window ends a current count needs to be all passed on (Rust `windows_to_pass`).
local function sw_windows(curr, q)
  if not q.debt then return 1 end
  local windows, rest = idiv(curr, q.limit)
  if rest > 0 then windows = windows + 1 end
  if windows < 1 then return 1 end
  return windows
end

-- Until the estimate decays to zero (Rust `reset_after`).
local function sw_reset(skew, left, prev, curr, q)
  if curr > 0 then return skew + left + q.period * sw_windows(curr, q) end
  if prev > 0 then return skew + left end
  return 0
end

local function sw_guess(a, left, cost, q)
  local period, limit = q.period, q.limit
  local fits_now = a.curr + cost <= limit
  if fits_now and a.prev > 0 then
    local room = limit - a.curr - cost
    return to_u64(ceil(left - room * period / a.prev))
  elseif a.curr > 0 then
    local room = limit - cost
    local within_next = ceil(period - room * period / a.curr)
    return left + to_u64(within_next)
  end
  return left
end

MAKE_ALGO[2] = function() return {
  fresh = function() return { ws = 0, prev = 0, curr = 0 } end,
  decode = function(raw)
    local ws, prev, curr = numbers(raw, '^w (%S+) (%S+) (%S+)$')
    if ws and prev and curr then return { ws = ws, prev = prev, curr = curr } end
  end,
  encode = function(s)
    if small_int(s.ws) and small_int(s.prev) and small_int(s.curr) then
      return string.format('w %d %d %d', s.ws, s.prev, s.curr)
    end
    return string.format('w %.0f %.0f %.0f', s.ws, s.prev, s.curr)
  end,
  decide = function(s, now, cost, q)
    local period = q.period
    local at = now
    if s.ws > at then at = s.ws end
    local skew = at - now
    local a = sw_assess(s, at, cost, q)
    local left = period - a.elapsed
    local charged = a.allowed or q.debt
    local curr_after = a.curr
    if charged then curr_after = a.curr + cost end
    local next, changed = s, false
    if charged and cost > 0 then
      next, changed = { ws = a.ws, prev = a.prev, curr = curr_after }, true
    end
    local reset_after = sw_reset(skew, left, a.prev, curr_after, q)
    local retry = 0
    if not a.allowed then
      if cost > q.limit then
        retry = period
      else
        local guess = skew + sw_guess(a, left, cost, q)
        retry = earliest(guess, function(d)
          local later = now + d
          if next.ws > later then later = next.ws end
          return sw_assess(next, later, cost, q).allowed
        end)
      end
    end
    local remaining = 0
    if a.allowed then remaining = to_u64(floor(q.limit - a.needed)) end
    local used = to_u64(ceil(a.needed))
    return a.allowed, remaining, reset_after, retry, used, next, changed
  end,
  -- Gives `n` units back to the current window's counter, never below zero (Rust
  -- `refund`).
  refund = function(s, now, n, q)
    local period = q.period
    local at = now
    if s.ws > at then at = s.ws end
    local skew = at - now
    local a = sw_assess(s, at, 0, q)
    local curr_after = sat_sub(a.curr, n)
    local next, changed = s, false
    if curr_after ~= a.curr then
      next, changed = { ws = a.ws, prev = a.prev, curr = curr_after }, true
    end
    local after = sw_assess(next, at, 0, q)
    local left = period - after.elapsed
    local reset_after = sw_reset(skew, left, after.prev, after.curr, q)
    return true, to_u64(floor(q.limit - after.needed)), reset_after, 0,
      to_u64(ceil(after.needed)), next, changed
  end,
  expires_at = function(s, q)
    local windows = 0
    if s.curr > 0 then windows = sw_windows(s.curr, q) + 1 elseif s.prev > 0 then windows = 1 end
    return s.ws + q.period * windows
  end,
  -- Another region's usage by its published state: its estimate over the rolling
  -- window ending now, rounded up (Rust `remote::remote_used`).
  remote_used = function(s, now, q)
    local period = q.period
    local ws = now - fmod(now, period)
    local prev, curr = 0, 0
    if s.ws == ws then
      prev, curr = s.prev, s.curr
    elseif s.ws + period == ws then
      prev = s.curr
    end
    local weight = (period - (now - ws)) / period
    return to_u64(ceil(prev * weight + curr))
  end,
} end
