"""Lua scripts: each runs atomically inside Redis, so check-then-act steps cannot interleave."""

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

# One round trip for a whole read: reclaim entries idle past min_idle from any consumer (a dead one),
# dead-letter the over-delivered, then take new entries; stale ones are acknowledged and counted.
# KEYS: stream, dead_letters, stats
# ARGV: group, consumer, min_idle_ms, count, max_deliveries, min_version
# Returns {{entry_id, deliveries, payload}*, stale, reclaimed, dead_lettered, last_entry_id}
READ = """
local group, consumer = ARGV[1], ARGV[2]
local want, max_deliveries, min_version = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local out, stale_ids, dead, reclaimed = {}, {}, 0, 0
local function take(entry_id, deliveries, fields)
  local version, payload = 0, nil
  for i = 1, #fields, 2 do
    if fields[i] == 'v' then version = tonumber(fields[i + 1]) elseif fields[i] == 'd' then payload = fields[i + 1] end
  end
  if version < min_version then
    stale_ids[#stale_ids + 1] = entry_id
    return false
  end
  out[#out + 1] = {entry_id, deliveries, payload}
  return true
end
local claimed = redis.call('XAUTOCLAIM', KEYS[1], group, consumer, ARGV[3], '0-0', 'COUNT', want)
for _, entry in ipairs(claimed[2]) do
  local entry_id, fields = entry[1], entry[2]
  local pending = redis.call('XPENDING', KEYS[1], group, entry_id, entry_id, 1)
  local deliveries = pending[1] and pending[1][4] or 1
  if deliveries > max_deliveries then
    local dlq_fields = {'entry', entry_id, 'deliveries', deliveries}
    for i = 1, #fields do dlq_fields[#dlq_fields + 1] = fields[i] end
    redis.call('XADD', KEYS[2], '*', unpack(dlq_fields))
    redis.call('XACK', KEYS[1], group, entry_id)
    redis.call('XDEL', KEYS[1], entry_id)
    dead = dead + 1
  elseif take(entry_id, deliveries, fields) then
    reclaimed = reclaimed + 1
  end
end
while #out < want do
  local asked = want - #out
  local reply = redis.call('XREADGROUP', 'GROUP', group, consumer, 'COUNT', asked, 'STREAMS', KEYS[1], '>')
  if not reply then break end
  local rows = reply[1][2]
  for _, row in ipairs(rows) do take(row[1], 1, row[2]) end
  if #rows < asked then break end
end
for i = 1, #stale_ids, 1000 do
  redis.call('XACK', KEYS[1], group, unpack(stale_ids, i, math.min(i + 999, #stale_ids)))
end
if #stale_ids > 0 then redis.call('HINCRBY', KEYS[3], 'dropped:stale', #stale_ids) end
if #out > 0 then redis.call('HINCRBY', KEYS[3], 'delivered', #out) end
if dead > 0 then redis.call('HINCRBY', KEYS[3], 'dead_lettered', dead) end
local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
return {out, #stale_ids, reclaimed, dead, last[1] and last[1][1] or '0-0'}
"""

# KEYS: stream, stats   ARGV: group, entry ids...
ACK = """
local acked = 0
for i = 2, #ARGV, 1000 do
  acked = acked + redis.call('XACK', KEYS[1], ARGV[1], unpack(ARGV, i, math.min(i + 999, #ARGV)))
end
if acked > 0 then redis.call('HINCRBY', KEYS[2], 'acked', acked) end
return acked
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
