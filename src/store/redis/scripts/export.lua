-- Export: the stored strings of KEYS (aggregated limits' states), to publish them to the
-- other regions; false where a key holds none.
return redis.call('MGET', unpack(KEYS))
