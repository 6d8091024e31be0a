"""What admission keeps in Redis for each endpoint, and the Lua scripts that read and change it
in one call each (`inference_ops.admission` says what they decide and why)."""

from django.conf import settings


def endpoint_base(endpoint: str) -> str:
    return f"{settings.REDIS_KEY_PREFIX}:admission:{endpoint}"


def endpoint_keys(name: str) -> tuple[str, str, str, str, str]:
    base = endpoint_base(name)
    return (f"{base}:held", f"{base}:waiting", f"{base}:lapses", f"{base}:usage", f"{base}:report")


# KEYS: five per member of the pool, in the order to try: held (slot -> end of lease), waiting
# (member -> score), lapses (member -> end of its place), usage (tenant -> "tokens time"), report
# (the engine's last report: `engine_report`). ARGV: slot ("tenant|id"), tenant, reserve, class
# rank, member ("tenant|process", '' to try without queueing), the member to take out first (''
# none), wait lease, tokens to count, half-life, how old a report may be, the lease of a place at
# a member after the first; then each member's capacity and lease. Returns {1, i} admitted at
# member i, {0, 0} not (queued when a member is given), {2, 0} not because the tenant holds all
# it may at every member (not queued).
TAKE = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
local slot, tenant, reserve, rank = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local member, previous, wait_lease = ARGV[5], ARGV[6], tonumber(ARGV[7])
local tokens, half, fresh = tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])
local move_lease = tonumber(ARGV[11])
local n = #KEYS / 5
local mine, used = {}, 0
for i = 1, n do
    local held, waiting, lapses = KEYS[5 * i - 4], KEYS[5 * i - 3], KEYS[5 * i - 2]
    redis.call('ZREMRANGEBYSCORE', held, '-inf', now)
    for _, name in ipairs(redis.call('ZRANGEBYSCORE', lapses, '-inf', now)) do
        redis.call('ZREM', waiting, name)
    end
    redis.call('ZREMRANGEBYSCORE', lapses, '-inf', now)
    if previous ~= '' then
        redis.call('ZREM', waiting, previous)
        redis.call('ZREM', lapses, previous)
    end
    mine[i] = 0
    local state = redis.call('HGET', KEYS[5 * i - 1], tenant)
    if state then
        local count, at = string.match(state, '(%S+) (%S+)')
        mine[i] = tonumber(count) * math.pow(0.5, (now - tonumber(at)) / half)
        used = used + mine[i]
    end
end
-- The tenant's place: log2 of its decayed count plus now / half-life. The same order as the
-- decayed counts at any moment, but it does not change while nothing is counted: a waiting
-- set's scores written at different times compare right, and one tenant's waiters keep theirs.
local place = -1e11
if used > 0 then
    place = now / half + math.log(used) / math.log(2)
end
local score = rank * 1e12 + place
local open = false
for i = 1, n do
    local held, waiting, usage = KEYS[5 * i - 4], KEYS[5 * i - 3], KEYS[5 * i - 1]
    local capacity, lease = tonumber(ARGV[10 + 2 * i]), tonumber(ARGV[11 + 2 * i])
    local report = redis.call('HMGET', KEYS[5 * i], 'at', 'limit')
    if report[1] and now - tonumber(report[1]) <= fresh then
        capacity = math.max(1, math.min(capacity, tonumber(report[2])))
    end
    local most = capacity
    if capacity > reserve then
        most = capacity - reserve
    end
    local holders = redis.call('ZRANGE', held, 0, -1)
    local per = {}
    for _, name in ipairs(holders) do
        local owner = string.match(name, '^(.*)|')
        per[owner] = (per[owner] or 0) + 1
    end
    if (per[tenant] or 0) < most then
        open = true
        local room = capacity - #holders
        if room > 0 then
            local ahead = 0
            for _, name in ipairs(redis.call('ZRANGEBYSCORE', waiting, '-inf', '(' .. score)) do
                if name ~= member and (per[string.match(name, '^(.*)|')] or 0) < most then
                    ahead = ahead + 1
                end
            end
            if ahead < room then
                if member ~= '' then
                    for j = 1, n do
                        redis.call('ZREM', KEYS[5 * j - 3], member)
                        redis.call('ZREM', KEYS[5 * j - 2], member)
                    end
                end
                local until_ = now + lease
                if i > 1 then
                    until_ = now + move_lease
                end
                redis.call('ZADD', held, until_, slot)
                redis.call('EXPIRE', held, math.ceil(lease) + 1)
                redis.call('HSET', usage, tenant, (mine[i] + tokens) .. ' ' .. now)
                redis.call('EXPIRE', usage, math.ceil(half * 10))
                return {1, i}
            end
        end
    end
end
if not open then
    return {2, 0}
end
if member ~= '' then
    for i = 1, n do
        redis.call('ZADD', KEYS[5 * i - 3], score, member)
        redis.call('ZADD', KEYS[5 * i - 2], now + wait_lease, member)
        redis.call('EXPIRE', KEYS[5 * i - 3], math.ceil(wait_lease) + 1)
        redis.call('EXPIRE', KEYS[5 * i - 2], math.ceil(wait_lease) + 1)
    end
end
return {0, 0}
"""

# A place taken at a later member of a pool, taken up by its request: its lease becomes the
# slot's full one, if it is still held. KEYS: held. ARGV: slot, lease. Returns 1, or 0 if lapsed.
TAKE_UP = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
local ends = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not ends or tonumber(ends) <= now then
    return 0
end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
return 1
"""

# The engine's report, from a health check's /metrics scrape: the room it leaves the gateway.
# KEYS: held, report. ARGV: running, waiting, KV-cache use (0 to 1), capacity, KV threshold.
# Returns the room, and the requests the engine has that the gateway did not admit.
REPORT = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
local held, report = KEYS[1], KEYS[2]
local running, waiting, kv = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local capacity, threshold = tonumber(ARGV[4]), tonumber(ARGV[5])
redis.call('ZREMRANGEBYSCORE', held, '-inf', now)
local outside = math.max(0, running + waiting - redis.call('ZCARD', held))
local batch = tonumber(redis.call('HGET', report, 'batch') or '')
if waiting > 0 and running > 0 then
    batch = running
elseif batch and running > batch then
    batch = nil
end
local top = capacity
if batch then
    top = math.min(top, batch)
end
if kv >= threshold then
    top = math.min(top, running)
end
local room = math.max(1, math.min(capacity, top - outside))
redis.call('DEL', report)
redis.call('HSET', report, 'at', now, 'limit', room, 'outside', outside)
if batch then
    redis.call('HSET', report, 'batch', batch)
end
redis.call('EXPIRE', report, 3600)
return {room, outside}
"""

# KEYS: queued (process -> "end of lease, then its waiting count per class"). ARGV: process,
# lease, one count per class of CLASSES. Drops the lapsed entries of dead processes on the way.
PUBLISH = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
local key, lease = KEYS[1], tonumber(ARGV[2])
local entries = redis.call('HGETALL', key)
for i = 1, #entries, 2 do
    if tonumber(string.match(entries[i + 1], '^(%S+)')) < now then
        redis.call('HDEL', key, entries[i])
    end
end
if ARGV[3] == '0' and ARGV[4] == '0' and ARGV[5] == '0' then
    redis.call('HDEL', key, ARGV[1])
else
    local counts = ARGV[3] .. ' ' .. ARGV[4] .. ' ' .. ARGV[5]
    redis.call('HSET', key, ARGV[1], string.format('%.3f ', now + lease) .. counts)
    redis.call('EXPIRE', key, math.ceil(lease) + 1)
end
return 1
"""

# KEYS: held, queued. Returns the slots held now and the waiting counts of every live process,
# one per class of CLASSES.
OCCUPANCY = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
local held = redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf')
local counts = {0, 0, 0}
local entries = redis.call('HGETALL', KEYS[2])
for i = 2, #entries, 2 do
    local lease, a, b, c = string.match(entries[i], '^(%S+) (%S+) (%S+) (%S+)$')
    if lease and tonumber(lease) >= now then
        counts[1], counts[2], counts[3] = counts[1] + a, counts[2] + b, counts[3] + c
    end
end
return {held, counts[1], counts[2], counts[3]}
"""
