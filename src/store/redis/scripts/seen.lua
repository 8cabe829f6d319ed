-- Seen: the mark another region leaves here with each publication. KEYS[1]: its key.
-- ARGV[1]: '' to read it, else the text to write (the number of keys published), with
-- ARGV[2] its TTL (ms, the stale time): a mark that is gone is a region not heard from.
-- Reading returns { text or false, TTL left in ms (negative: no mark) }.
if ARGV[1] == '' then
  return { redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1]) }
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
