-- Fixed window (mirror of src/algorithm/fixed_window.rs). State: {ws, count}.
-- The count of `s` in the window starting at `ws` (Rust `carried`): under debt, what is
-- left once each window since has paid `limit` back.
local function fw_carried(s, ws, q)
  if ws == s.ws then return s.count end
  if not q.debt or q.limit == 0 then return 0 end
  local windows = idiv(ws - s.ws, q.period)
  return sat_sub(s.count, q.limit * windows)
end

-- Window ends a count needs to be paid back (Rust `windows_to_pay`).
local function fw_windows(count, q)
  if not q.debt or q.limit == 0 then return 1 end
  local windows, rest = idiv(count, q.limit)
  if rest > 0 then windows = windows + 1 end
  if windows < 1 then return 1 end
  return windows
end

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
    local count = fw_carried(s, ws, q)
    local count_after = count + cost
    local allowed = count_after <= q.limit
    local reset_after = sat_sub(ws + q.period * fw_windows(count_after, q), now)
    local remaining, retry = 0, 0
    if allowed then
      remaining = q.limit - count_after
    elseif q.debt and cost <= q.limit then
      retry = sat_sub(ws + q.period * fw_windows(count_after + cost - q.limit, q), now)
    else
      retry = sat_sub(ws + q.period, now)
    end
    if cost > 0 then
      return allowed, remaining, reset_after, retry, count_after, { ws = ws, count = count_after }, true
    end
    return allowed, remaining, reset_after, retry, count_after, s, false
  end,
  -- Gives `n` units back to the current window, never below zero (Rust `refund`).
  refund = function(s, now, n, q)
    local ws = now - fmod(now, q.period)
    if s.ws > ws then ws = s.ws end
    local count = fw_carried(s, ws, q)
    local after = sat_sub(count, n)
    local decided = { ws = ws, count = after }
    if after == count then decided = s end
    return true, sat_sub(q.limit, after), sat_sub(ws + q.period * fw_windows(after, q), now), 0,
      after, decided, after ~= count
  end,
  expires_at = function(s, q) return s.ws + q.period * fw_windows(s.count, q) end,
  -- Another region's usage by its published state: its count of this window (Rust
  -- `remote::remote_used`).
  remote_used = function(s, now, q)
    if s.ws == now - fmod(now, q.period) then return s.count end
    return 0
  end,
} end
