-- Import: another region's published states. KEYS: where each is kept here (its limit's
-- key .. ':from:<region>'). ARGV: [1] now in µs, or '' for Redis TIME (tests inject a
-- clock; TTLs then get an hour more), then per key its window (µs) and the state
-- published (a window algorithm's stored string).
-- Each key keeps the newer of the state it holds and the one published: the later
-- window, and in the same window the larger of each count. So a publication sent twice,
-- late or out of order counts once and never takes usage back. The TTL is the state's
-- expiry: it is gone with its window. Returns the number of keys written.
local now, ttl_extra = script_clock(ARGV[1])
local KIND_OF_TAG = { f = 1, w = 2 }
local written = 0
for i = 1, #KEYS do
  local period = ARGV[2 * i] + 0
  local raw = ARGV[2 * i + 1]
  local kind = KIND_OF_TAG[string.sub(raw, 1, 1)]
  local algo = kind and ALGOS[kind]
  local theirs = algo and period > 0 and algo.decode(raw)
  if theirs then
    local q = { limit = 1, period = period, burst = 0, debt = false }
    local held = redis.pcall('GET', KEYS[i])
    local kept = type(held) == 'string' and algo.decode(held)
    local merged = theirs
    if kept then
      if kept.ws > theirs.ws then
        merged = kept
      elseif kept.ws == theirs.ws then
        merged = {}
        for field, value in pairs(theirs) do
          local other = kept[field]
          if other > value then value = other end
          merged[field] = value
        end
      end
    end
    local expires = algo.expires_at(merged, q)
    if expires > now and (not kept or algo.encode(merged) ~= held) then
      local ttl_ms = ceil((expires - now) / 1000) + ttl_extra
      redis.call('SET', KEYS[i], algo.encode(merged), 'PX', int(ttl_ms))
      written = written + 1
    end
  end
end
return written
