-- Concurrency limits: the hold entry point (mirror of src/algorithm/concurrency.rs
-- `hold`). KEYS[1] is the limit's key: a sorted set with one member per slot held (its
-- id, 16 hex digits), scored by the instant it was taken (µs). ARGV:
--   [1] now in µs, or '' to read Redis TIME (tests inject a clock; an injected clock
--       also lengthens the TTL by an hour, since its time is not Redis's)
--   [2] the op: 1 acquire, 0 probe (changes nothing), -1 release
--   [3] the slot's id
--   [4] the limit (slots), [5] the period (max_hold, µs)
-- A slot taken at or before now - period is reclaimed. Returns five integers: allowed
-- (1/0), remaining, reset_after, retry_after, used.
local now, ttl_extra = script_clock(ARGV[1])
local key = KEYS[1]
local op = ARGV[2] + 0
local slot = ARGV[3]
local limit, period = ARGV[4] + 0, ARGV[5] + 0
local RETRY_CAP = 1000000

if limit == 0 or period == 0 then
  if op < 0 then return { 1, 0, 0, 0, 0 } end
  local retry = period
  if retry < 1 then retry = 1 end
  return { 0, 0, 0, retry, 1 }
end

-- A key of another type holds no slot of ours: it reads as none held, and an acquire
-- replaces it.
local stored = redis.call('TYPE', key).ok
local foreign = stored ~= 'zset' and stored ~= 'none'
local cutoff = int(now - period)
local live, held = 0, false
if not foreign then
  if op ~= 0 then
    redis.call('ZREMRANGEBYSCORE', key, '-inf', cutoff)
    live = redis.call('ZCARD', key)
  else
    live = redis.call('ZCOUNT', key, '(' .. cutoff, '+inf')
  end
  local since = redis.call('ZSCORE', key, slot)
  held = since ~= false and since ~= nil and tonumber(since) > now - period
end

local allowed = true
local changed = false
if op < 0 then
  if held then
    redis.call('ZREM', key, slot)
    live, changed = live - 1, true
  end
elseif not held then
  allowed = live < limit
  if allowed and op > 0 then
    if foreign then redis.call('DEL', key) end
    redis.call('ZADD', key, int(now), slot)
    live, changed = live + 1, true
  end
end

local reset, retry = 0, 0
if live > 0 then
  local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  reset = sat_sub(tonumber(newest[2]) + period, now)
  if op ~= 0 then
    -- Reclaimed slots are gone already; the TTL drops the key when the newest is.
    redis.call('PEXPIRE', key, int(ceil(reset / 1000) + ttl_extra))
  end
  if not allowed then
    local oldest = redis.call('ZRANGEBYSCORE', key, '(' .. cutoff, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
    retry = sat_sub(tonumber(oldest[2]) + period, now)
    if retry < 1 then retry = 1 end
    if retry > RETRY_CAP then retry = RETRY_CAP end
  end
end

local remaining, used = 0, live + 1
if allowed then remaining, used = sat_sub(limit, live), live end
return { allowed and 1 or 0, remaining, reset, retry, used }
