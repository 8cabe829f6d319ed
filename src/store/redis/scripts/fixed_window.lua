-- Fixed window (mirror of src/algorithm/fixed_window.rs). State: {ws, count}.
MAKE_ALGO[1] = function() return {
  fresh = function() return { ws = 0, count = 0 } end,
  decode = function(raw)
    local ws, count = numbers(raw, '^f (%S+) (%S+)$')
    if ws and count then return { ws = ws, count = count } end
  end,
  encode = function(s) return format_pair('f %d %d', 'f %.0f %.0f', s.ws, s.count) end,
  decide = function(s, now, cost, q)
    local ws = now - fmod(now, q.period)
    if s.ws > ws then ws = s.ws end
    local count = 0
    if ws == s.ws then count = s.count end
    local reset_after = sat_sub(ws + q.period, now)
    local count_after = count + cost
    local allowed = count_after <= q.limit
    local remaining, retry = 0, reset_after
    if allowed then remaining = q.limit - count_after; retry = 0 end
    if cost > 0 then
      return allowed, remaining, reset_after, retry, count_after, { ws = ws, count = count_after }, true
    end
    return allowed, remaining, reset_after, retry, count_after, s, false
  end,
  expires_at = function(s, q) return s.ws + q.period end,
} end
