-- Sliding log (mirror of src/algorithm/sliding_log.rs). In Redis the log is a sorted set
-- with one member per admitted unit: score = the instant it was admitted (µs), member
-- "at:n" for the n-th unit admitted at that instant. A check costs O(log N) Redis work
-- however long the log is: ZCOUNT counts the units in the window, ZRANGE by index finds
-- the unit whose leaving frees enough room, and expired units leave by score. (Reading
-- and rewriting the whole log on every call, as this script once did, made a full log
-- cost ~1.5 ms of Redis per call: with several instances' calls queued behind each
-- other, that passed the store deadline, and the failure mode admitted past the limit.)
--
-- The script's state of a key is a summary of the log, never the log itself:
--   key            the sorted set (nil: a fresh log, nothing stored counts)
--   cutoff         stored units at or before it had left the window when it was read
--   gone, live     how many stored units had left by then (the oldest `gone` by index),
--                  and how many are still in the window
--   newest         the instant of the newest unit, stored or added (0: none)
--   stored_newest  the newest stored instant when it was read
--   added          units this call admitted, all at instant `newest`
--   dropped        the newest stored units this call gave back (a refund), not in `live`
local SL_FRESH = { newest = 0, stored_newest = 0, gone = 0, live = 0, added = 0, dropped = 0 }

-- How many members one ZADD sends at most.
local SL_ZADD_CHUNK = 256

MAKE_ALGO[3] = function()
local algo = {
  tag = 'l',
  -- A refused request can be admitted later (max_delay, Rust AlgorithmKind::delays),
  -- and an admission behind a reservation is dated with it (Rust decide_delayed).
  delays = true,
  dated = true,
  fresh = function() return SL_FRESH end,
  -- Reads the key's summary at `now` for a limit of period q.period (the key names its
  -- period). A key of another type, or a newest member that is not "at:n", reads as
  -- fresh (foreign = true: rewritten).
  load = function(key, now, q)
    local top = redis.pcall('ZRANGE', key, -1, -1, 'WITHSCORES')
    if type(top) ~= 'table' or top.err then return SL_FRESH, true end
    if top[1] == nil then return SL_FRESH, false end
    local newest = field(tonumber(top[2]))
    if not (newest and string.match(top[1], '^%d+:%d+$')) then return SL_FRESH, true end
    local at = now
    if newest > at then at = newest end
    local cutoff = at - q.period
    local gone = redis.call('ZCOUNT', key, '-inf', int(cutoff))
    local live = redis.call('ZCARD', key) - gone
    return { key = key, cutoff = cutoff, gone = gone, live = live, newest = newest,
      stored_newest = newest, added = 0, dropped = 0 }, false
  end,
  -- Writes what the call changed: drops the units that left the window, adds the
  -- call's units as members after those already stored at their instant.
  store = function(key, orig, foreign, s, ttl_ms)
    if s.key == nil then
      -- A fresh log (read as one, or expired): whatever the key held goes.
      if foreign or orig.key then redis.call('DEL', key) end
    else
      if s.gone > 0 then
        redis.call('ZREMRANGEBYSCORE', key, '-inf', int(s.cutoff))
      end
      if s.dropped > 0 then
        redis.call('ZREMRANGEBYRANK', key, -s.dropped, -1)
      end
    end
    if s.added > 0 then
      -- Stored units can be at `newest` only if it is not past the newest stored one
      -- (a refund can move it back to one of theirs).
      local n = 0
      if s.key and s.newest <= s.stored_newest then
        n = redis.call('ZCOUNT', key, int(s.newest), int(s.newest))
      end
      local at = int(s.newest)
      -- Names after the units already there; after a refund took some of them, a name
      -- may still be taken: ZADD then adds fewer, and the next names follow.
      local todo = s.added
      while todo > 0 do
        local args, a = { 'ZADD', key }, 2
        local upto = n + math.min(todo, SL_ZADD_CHUNK)
        for i = n + 1, upto do
          args[a + 1], args[a + 2] = at, at .. ':' .. int(i)
          a = a + 2
        end
        todo = todo - redis.call(unpack(args))
        n = upto
      end
    end
    redis.call('PEXPIRE', key, int(ttl_ms))
  end,
  decide = function(s, now, cost, q)
    local period = q.period
    local at = now
    if s.newest > at then at = s.newest end
    local in_window = s.live + s.added
    local used = in_window + cost
    local allowed = used <= q.limit
    local retry = 0
    if not allowed then
      if cost > q.limit then
        retry = period
      else
        -- The oldest `excess` units must leave: the excess-th oldest in the window is a
        -- stored one (found by index) or one of the units this call added.
        local excess = used - q.limit
        local leaves = s.newest
        if excess <= s.live then
          local index = s.gone + excess - 1
          local unit = redis.call('ZRANGE', s.key, index, index, 'WITHSCORES')
          leaves = tonumber(unit[2])
        end
        retry = sat_sub(leaves + period, now)
      end
    end
    local newest_after = nil
    if allowed and cost > 0 then
      newest_after = at
    elseif in_window > 0 then
      newest_after = s.newest
    end
    local reset_after = 0
    if newest_after then reset_after = sat_sub(newest_after + period, now) end
    local remaining = 0
    if allowed then remaining = q.limit - used end
    if not allowed or cost == 0 then
      return allowed, remaining, reset_after, retry, used, s, false
    end
    return allowed, remaining, reset_after, retry, used, {
      key = s.key, cutoff = s.cutoff, gone = s.gone, live = s.live, newest = at,
      stored_newest = s.stored_newest, added = s.added + cost, dropped = s.dropped,
    }, true
  end,
  -- Gives back the `n` newest units of the live log (Rust `refund`): this call's own
  -- first (they are the newest), then stored ones from the top.
  refund = function(s, now, n, q)
    local from_added = n
    if s.added < from_added then from_added = s.added end
    local from_stored = n - from_added
    if s.live < from_stored then from_stored = s.live end
    local added, live = s.added - from_added, s.live - from_stored
    local dropped = s.dropped + from_stored
    local in_window = live + added
    local newest = s.newest
    if added == 0 then
      if live == 0 then
        newest = 0
      elseif dropped > 0 then
        local unit = redis.call('ZRANGE', s.key, s.gone + live - 1, s.gone + live - 1, 'WITHSCORES')
        newest = tonumber(unit[2])
      else
        newest = s.stored_newest
      end
    end
    local reset_after = 0
    if in_window > 0 then reset_after = sat_sub(newest + q.period, now) end
    local decided, changed = s, false
    if from_added + from_stored > 0 then
      decided, changed = {
        key = s.key, cutoff = s.cutoff, gone = s.gone, live = live, newest = newest,
        stored_newest = s.stored_newest, added = added, dropped = dropped,
      }, true
    end
    return true, sat_sub(q.limit, in_window), reset_after, 0, in_window, decided, changed
  end,
  expires_at = function(s, q)
    if s.key or s.added > 0 then return s.newest + q.period end
    return 0
  end,
}
-- The summary as it reads at `at`, later than `now` (a delayed admission is decided
-- then), for `key`: the call's changes so far are written first and the log read again
-- at `at`, since a summary holds the units a call added at one instant only, and a
-- delayed admission adds them at another. (`orig`: the state the call first read;
-- `foreign`: the key held another type; both as `store` takes them.)
algo.advance = function(s, at, q, key, orig, foreign)
  algo.store(key, orig, foreign, s, ceil(q.period / 1000) + 1000)
  local reloaded = algo.load(key, at, q)
  return reloaded
end
return algo
end
