-- Sliding window counter (mirror of src/algorithm/sliding_window.rs).
-- State: {ws, prev, curr}.
local function sw_assess(s, at, cost, q)
  local period = q.period
  local ws = at - fmod(at, period)
  local prev, curr = 0, 0
  if ws <= s.ws then
    prev, curr = s.prev, s.curr
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
    local curr_after = a.curr
    if a.allowed then curr_after = a.curr + cost end
    local reset_after = 0
    if curr_after > 0 then
      reset_after = skew + left + period
    elseif a.prev > 0 then
      reset_after = skew + left
    end
    local retry = 0
    if not a.allowed then
      if cost > q.limit then
        retry = period
      else
        local guess = skew + sw_guess(a, left, cost, q)
        retry = earliest(guess, function(d)
          local later = now + d
          if s.ws > later then later = s.ws end
          return sw_assess(s, later, cost, q).allowed
        end)
      end
    end
    local remaining = 0
    if a.allowed then remaining = to_u64(floor(q.limit - a.needed)) end
    local used = to_u64(ceil(a.needed))
    if a.allowed and cost > 0 then
      return a.allowed, remaining, reset_after, retry, used,
        { ws = a.ws, prev = a.prev, curr = curr_after }, true
    end
    return a.allowed, remaining, reset_after, retry, used, s, false
  end,
  expires_at = function(s, q)
    local windows = 0
    if s.curr > 0 then windows = 2 elseif s.prev > 0 then windows = 1 end
    return s.ws + q.period * windows
  end,
} end
