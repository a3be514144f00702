"""Lua scripts: each runs atomically inside Redis, so check-then-act steps cannot interleave.

Moving a payload through Lua costs far more than the command itself (each argument and each reply
becomes a Lua string: measured 0.8 ms of Redis time to pass 64 x 7.4 KB into a script that does
nothing, against 0.3 ms for MULTI with the 64 XADDs). So the hot paths keep payloads out of Lua:
RECLAIM and DELIVERED handle entry ids and counts only, reads take payloads with a plain XREADGROUP (in
the same MULTI), and puts go through an optimistic MULTI that FRESH checks ids for (see
ExperienceStream.put); PUT serves puts that lost that race, and priority replay.
"""

# KEYS: stream, seen, stats, priority   ARGV: now_ms, ttl_ms, replay(0|1), then (id, version, payload)*
PUT = """
local now = tonumber(ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - tonumber(ARGV[2]))
local accepted, duplicates = 0, 0
local entry_ids = {}
for i = 4, #ARGV, 3 do
  local id = ARGV[i]
  if redis.call('ZSCORE', KEYS[2], id) then
    duplicates = duplicates + 1
  else
    redis.call('ZADD', KEYS[2], now, id)
    local entry = redis.call('XADD', KEYS[1], '*', 'id', id, 'v', ARGV[i + 1], 'd', ARGV[i + 2])
    if ARGV[3] == '1' then redis.call('ZADD', KEYS[4], tonumber(ARGV[i + 1]), entry) end
    accepted = accepted + 1
    entry_ids[#entry_ids + 1] = entry
  end
end
if accepted > 0 then redis.call('HINCRBY', KEYS[3], 'put', accepted) end
if duplicates > 0 then redis.call('HINCRBY', KEYS[3], 'dropped:duplicate', duplicates) end
return {accepted, duplicates, entry_ids}
"""

# A put's ids against the seen-set, between its WATCH (of the seen-set and the guard) and its MULTI, in
# the same round trip: if any id was seen (and has not expired), write the guard, so that the MULTI, which
# appends them all, aborts; the put then takes the two-step path that sorts duplicates out.
# KEYS: seen, guard   ARGV: expired_before_ms, ids...   Returns how many ids were seen
FRESH = """
local expired_before = tonumber(ARGV[1])
local seen = 0
for i = 2, #ARGV, 1000 do
  local scores = redis.call('ZMSCORE', KEYS[1], unpack(ARGV, i, math.min(i + 999, #ARGV)))
  for _, score in ipairs(scores) do
    if score and tonumber(score) > expired_before then seen = seen + 1 end
  end
end
if seen > 0 then redis.call('INCR', KEYS[2]) end
return seen
"""

# The number of entries pending for one consumer of a group (XPENDING's summary lists them by consumer).
_PENDING_OF = """
local function pending_of(stream, group, consumer)
  local consumers = redis.call('XPENDING', stream, group)[4]
  if consumers then
    for _, row in ipairs(consumers) do
      if row[1] == consumer then return tonumber(row[2]) end
    end
  end
  return 0
end
"""

# Take over entries idle past min_idle from any consumer (a dead one), by id only: JUSTID moves
# ownership without touching the delivery counter, so it is set here to the delivery about to happen.
# Entries past max_deliveries move to the dead-letter stream instead. Payloads never enter Lua except
# for the (rare) dead-lettered entries.
# A read runs it in one MULTI with its XREADGROUP and then DELIVERED, which together count what the
# read delivered without a round trip of their own: the claimed entries, plus the consumer's pending
# entries after the XREADGROUP less those before it (subtracted here).
# KEYS: stream, dead_letters, stats   ARGV: group, consumer, min_idle_ms, count, max_deliveries
# Returns {{entry_id, deliveries}*, dead_lettered}
RECLAIM = (
    _PENDING_OF
    + """
local group, consumer = ARGV[1], ARGV[2]
local max_deliveries = tonumber(ARGV[5])
local out, dead = {}, 0
local claimed = redis.call('XAUTOCLAIM', KEYS[1], group, consumer, ARGV[3], '0-0', 'COUNT', ARGV[4], 'JUSTID')
for _, entry_id in ipairs(claimed[2]) do
  local pending = redis.call('XPENDING', KEYS[1], group, entry_id, entry_id, 1)
  local deliveries = (pending[1] and pending[1][4] or 0) + 1
  if deliveries > max_deliveries then
    local rows = redis.call('XRANGE', KEYS[1], entry_id, entry_id)
    local dlq_fields = {'entry', entry_id, 'deliveries', deliveries}
    if rows[1] then
      for _, value in ipairs(rows[1][2]) do dlq_fields[#dlq_fields + 1] = value end
    end
    redis.call('XADD', KEYS[2], '*', unpack(dlq_fields))
    redis.call('XACK', KEYS[1], group, entry_id)
    redis.call('XDEL', KEYS[1], entry_id)
    dead = dead + 1
  else
    redis.call('XCLAIM', KEYS[1], group, consumer, 0, entry_id, 'RETRYCOUNT', deliveries, 'JUSTID')
    out[#out + 1] = {entry_id, deliveries}
  end
end
if dead > 0 then redis.call('HINCRBY', KEYS[3], 'dead_lettered', dead) end
local counted = #out - pending_of(KEYS[1], group, consumer)
if counted ~= 0 then redis.call('HINCRBY', KEYS[3], 'delivered', counted) end
return {out, dead}
"""
)

# After a read's XREADGROUP, in the same MULTI as RECLAIM (see there).
# KEYS: stream, stats   ARGV: group, consumer   Returns the consumer's pending count
DELIVERED = (
    _PENDING_OF
    + """
local pending = pending_of(KEYS[1], ARGV[1], ARGV[2])
if pending ~= 0 then redis.call('HINCRBY', KEYS[2], 'delivered', pending) end
return pending
"""
)

# KEYS: stream, stats   ARGV: group, entry ids...
ACK = """
local acked = 0
for i = 2, #ARGV, 1000 do
  acked = acked + redis.call('XACK', KEYS[1], ARGV[1], unpack(ARGV, i, math.min(i + 999, #ARGV)))
end
if acked > 0 then redis.call('HINCRBY', KEYS[2], 'acked', acked) end
return acked
"""

# Reset the idle time of entries a consumer still holds, so that no read reclaims them for another claim_idle_ms;
# an entry it no longer holds (acknowledged, or reclaimed by another consumer) is left alone, never taken back.
# JUSTID leaves the delivery counter as it is.
# KEYS: stream   ARGV: group, consumer, ids...   Returns how many were renewed
RENEW = """
local renewed = 0
for i = 3, #ARGV do
  local held = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1, ARGV[2])
  if #held == 1 then
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i], 'JUSTID')
    renewed = renewed + 1
  end
end
return renewed
"""

# Priority replay: take the highest-priority entries, count a use, re-score or retire them.
# KEYS: stream, priority, uses, stats   ARGV: count, decay, use_limit, min_version
# Returns {{entry_id, uses, fields}*, stale}
REPLAY = """
local want, decay = tonumber(ARGV[1]), tonumber(ARGV[2])
local use_limit, min_version = tonumber(ARGV[3]), tonumber(ARGV[4])
local selected, stale, offset = {}, 0, 0
while #selected < want do
  local ids = redis.call('ZREVRANGE', KEYS[2], offset, offset + want - #selected - 1)
  if #ids == 0 then break end
  for _, entry_id in ipairs(ids) do
    local rows = redis.call('XRANGE', KEYS[1], entry_id, entry_id)
    local version = nil
    if #rows > 0 then
      local fields = rows[1][2]
      for i = 1, #fields, 2 do if fields[i] == 'v' then version = tonumber(fields[i + 1]) end end
    end
    if version == nil or version < min_version then
      -- removing shifts later ranks down, so the offset advances only over kept entries
      redis.call('ZREM', KEYS[2], entry_id)
      redis.call('HDEL', KEYS[3], entry_id)
      if version ~= nil then
        redis.call('XDEL', KEYS[1], entry_id)
        stale = stale + 1
      end
    else
      selected[#selected + 1] = {entry_id, version, rows[1][2]}
      offset = offset + 1
    end
  end
end
local out = {}
for _, item in ipairs(selected) do
  local entry_id, version = item[1], item[2]
  local uses = redis.call('HINCRBY', KEYS[3], entry_id, 1)
  if uses >= use_limit then
    redis.call('ZREM', KEYS[2], entry_id)
    redis.call('HDEL', KEYS[3], entry_id)
    redis.call('XDEL', KEYS[1], entry_id)
  else
    redis.call('ZADD', KEYS[2], version - decay * uses, entry_id)
  end
  out[#out + 1] = {entry_id, uses, item[3]}
end
if stale > 0 then redis.call('HINCRBY', KEYS[4], 'dropped:stale', stale) end
if #out > 0 then redis.call('HINCRBY', KEYS[4], 'delivered', #out) end
return {out, stale}
"""
