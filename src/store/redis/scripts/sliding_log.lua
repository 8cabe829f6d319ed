-- Sliding log (mirror of src/algorithm/sliding_log.rs). State: runs {at, units}, oldest
-- first, kept in a sorted set: score = at, member = "at:units".
local function sl_member(run)
  return int(run.at) .. ':' .. int(run.units)
end

MAKE_ALGO[3] = function() return {
  tag = 'l',
  fresh = function() return { runs = {} } end,
  -- Reads the whole log; a key of another type, or a log with a member that is not
  -- "at:units", reads as fresh (foreign = true: rewritten).
  load = function(key)
    local raw = redis.pcall('ZRANGE', key, 0, -1)
    if type(raw) ~= 'table' or raw.err then return { runs = {} }, true end
    local runs = {}
    for i, member in ipairs(raw) do
      local at, units = string.match(member, '^(%d+):(%d+)$')
      at, units = field(tonumber(at)), field(tonumber(units))
      if not (at and units) then return { runs = {} }, true end
      runs[i] = { at = at, units = units }
    end
    return { runs = runs }, false
  end,
  -- Writes only what changed: prunes runs older than the first kept one and adds or
  -- replaces the runs that differ from the loaded log.
  store = function(key, orig, foreign, s, ttl_ms)
    local first = s.runs[1]
    local kept = {}
    for _, run in ipairs(s.runs) do kept[run.at] = run.units end
    -- Incremental only when every dropped run is older than the first kept one (the
    -- usual case); a clock that stepped back over an expired log rewrites it.
    local rewrite = foreign
    local before = {}
    for _, run in ipairs(orig.runs) do
      before[run.at] = run.units
      if kept[run.at] == nil and first and run.at >= first.at then rewrite = true end
    end
    if rewrite then
      redis.call('DEL', key)
      before = {}
    elseif first then
      redis.call('ZREMRANGEBYSCORE', key, '-inf', '(' .. int(first.at))
    end
    for _, run in ipairs(s.runs) do
      local old = before[run.at]
      if old ~= run.units then
        if old then redis.call('ZREM', key, sl_member({ at = run.at, units = old })) end
        redis.call('ZADD', key, int(run.at), sl_member(run))
      end
    end
    redis.call('PEXPIRE', key, int(ttl_ms))
  end,
  decide = function(s, now, cost, q)
    local period = q.period
    local all = s.runs
    local newest = 0
    if #all > 0 then newest = all[#all].at end
    local at = now
    if newest > at then at = newest end
    local live = #all + 1
    for i, run in ipairs(all) do
      if run.at + period > at then live = i; break end
    end
    local in_window = 0
    for i = live, #all do in_window = in_window + all[i].units end
    local used = in_window + cost
    local allowed = used <= q.limit
    local retry = 0
    if not allowed then
      if cost > q.limit then
        retry = period
      else
        local excess = used - q.limit
        local freed = 0
        retry = period
        for i = live, #all do
          freed = freed + all[i].units
          if freed >= excess then
            retry = sat_sub(all[i].at + period, now)
            break
          end
        end
      end
    end
    local newest_after = nil
    if allowed and cost > 0 then
      newest_after = at
    elseif live <= #all then
      newest_after = all[#all].at
    end
    local reset_after = 0
    if newest_after then reset_after = sat_sub(newest_after + period, now) end
    local remaining = 0
    if allowed then remaining = q.limit - used end
    if not allowed or cost == 0 then
      return allowed, remaining, reset_after, retry, used, s, false
    end
    local runs = {}
    for i = live, #all do runs[#runs + 1] = { at = all[i].at, units = all[i].units } end
    local last = runs[#runs]
    if last and last.at == at then
      last.units = last.units + cost
    else
      runs[#runs + 1] = { at = at, units = cost }
    end
    return allowed, remaining, reset_after, retry, used, { runs = runs }, true
  end,
  expires_at = function(s, q)
    local last = s.runs[#s.runs]
    if last then return last.at + q.period end
    return 0
  end,
} end
