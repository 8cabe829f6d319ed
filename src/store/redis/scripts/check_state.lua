-- main.lua's working tables, and the helpers that use them. They are made once per node
-- in the function library, where they outlive a call (src/store/redis/functions.rs), and
-- once per call under EVALSHA. Making a table and collecting it costs Redis ~700
-- instructions empty and ~1 400 with one entry (callgrind). A call of one check made
-- some twenty of them; keeping them saves about a quarter of its cost. Each call starts
-- with `begin_call`, which drops what the call before it left, even if that call
-- failed halfway.
--
-- Every distinct key of a call has a slot, numbered in first-seen order. Per slot: its
-- key, algorithm, current state, state as loaded, whether Redis holds another type
-- there (known to an algorithm that reads its own key, see sliding_log.lua), and, once
-- a committed decision changed it, the quota it was decided under (set: the state is to
-- be written). Parallel arrays, so there is no table per key. Entries past this call's
-- last slot (or key, or limit) are left over from an earlier call and are never read.
-- Only `slot_of` is cleared, since it is looked up by key.
local slot_of = {}
local slot_key, slot_kind, slot_state, slot_orig, slot_foreign, slot_quota = {}, {}, {}, {}, {}, {}
local slots = 0
-- Each key's stored string, by index in KEYS (MGET: false where there is none).
local stored = {}
-- For each limit of the check being decided: its next state (false: none to keep) and
-- its slot.
local nexts, slot_at = {}, {}
-- The call's packed decisions, one string per limit.
local out = {}
-- The call's rules, by number: each a table of its limits' algorithms, quotas (tables
-- of limit, period and burst), algorithm tables and whether the quota is invalid. A
-- quota table is the same object for every check of its limit in a call, which
-- token_bucket.lua's memo of a state's expiry relies on; the states that memo is in
-- last one call only.
local rules = {}
-- One fresh state per algorithm. Nothing in these scripts changes a state in place (a
-- decision that changes one returns a new table), so every check and call shares it.
local fresh_of = {}

-- After a call with more keys than this, its tables are dropped rather than kept, so
-- one huge call does not hold its states until the next.
local KEPT_KEYS = 1024
-- The number of keys of the call before (0 before the first).
local kept_keys = 0

-- Starts a call with `keys` keys: forgets the call before's slots.
local function begin_call(keys)
  if kept_keys > KEPT_KEYS then
    slot_of, slot_key, slot_kind, slot_state = {}, {}, {}, {}
    slot_orig, slot_foreign, slot_quota = {}, {}, {}
    stored, nexts, slot_at, out, rules = {}, {}, {}, {}, {}
  else
    for slot = 1, slots do slot_of[slot_key[slot]] = nil end
  end
  slots, kept_keys = 0, keys
end

-- The shared fresh state of algorithm `kind`. The per-check loop reads `fresh_of[kind]`
-- itself before calling this.
local function fresh(kind)
  local state = fresh_of[kind]
  if state == nil then
    state = ALGOS[kind].fresh()
    fresh_of[kind] = state
  end
  return state
end

-- The slot of `key` (KEYS[index]) under algorithm `kind`, its state read on first use
-- (an algorithm that reads its own key, the sliding log, reads only what the call's `now`
-- and the limit's quota `q` need).
local function load(key, index, kind, now, q)
  local slot = slot_of[key]
  if slot and slot_kind[slot] == kind then return slot end
  local algo = ALGOS[kind]
  local state, foreign
  if slot then
    -- Same key under another algorithm within one call: fresh, as in Rust.
    state, foreign = fresh(kind), true
  elseif algo.load then
    state, foreign = algo.load(key, now, q)
  else
    local raw = stored[index]
    foreign = false
    if raw then state = algo.decode(raw) end
    if state == nil then state = fresh_of[kind] or fresh(kind) end
  end
  if slot == nil then
    slots = slots + 1
    slot = slots
    slot_of[key] = slot
    slot_key[slot] = key
  end
  slot_kind[slot], slot_state[slot], slot_orig[slot] = kind, state, state
  slot_foreign[slot], slot_quota[slot] = foreign, nil
  return slot
end

-- The key suffix of each other region's published states (':from:<region>'), in the
-- order of every aggregated limit's floors (see main.lua).
local suffixes = {}
-- The quota an aggregated limit is decided under: its own, with what the other regions
-- take out of the limit (one table, filled in again for each such check).
local shared_quota = {}

-- Units the other regions take of aggregated limit `q` at `key` (Rust
-- `remote::taken_by_others`): each region's usage by its published state at
-- key .. suffix, or its floor (its fallback share while its link is cut) when more.
local function others_taken(algo, key, now, q)
  local taken = 0
  local floors = q.floors
  for j = 1, q.regions do
    local used = 0
    -- pcall: a key of another type there reads as nothing, never fails the call.
    local raw = redis.pcall('GET', key .. suffixes[j])
    if type(raw) == 'string' then
      local theirs = algo.decode(raw)
      if theirs then used = algo.remote_used(theirs, now, q) end
    end
    if floors[j] > used then used = floors[j] end
    taken = taken + used
  end
  return taken
end
