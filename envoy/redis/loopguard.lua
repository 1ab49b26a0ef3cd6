#!lua name=loopguard
--[[
loopguard's shared window state in Redis, as one atomic call per request.

  FCALL loopguard_hit 3 <window key> <cooldown key> <event key>
        <window_ms> <capacity> <trip_at> <cooldown_ms> <detect_at> <event_every_ms> <nonce>

Keys share a hash tag (lg:<plugin name>:{<fingerprint>}:w / :cd / :ev), so
they live on one shard. The sliding log is a sorted set of hits scored by Redis's own
clock (replica clocks do not matter), trimmed to the window and to the
newest <capacity> hits, expiring with the window. Policy numbers travel with
every call: Redis needs no configuration of its own.

  FCALL loopguard_near 3 <history key> <cooldowns key> <events key>
        <window_ms> <capacity> <trip_at> <cooldown_ms> <detect_at> <event_every_ms> <nonce>
        <signature> <min_matches>

Near mode: the keys name a caller's record (lg:<plugin name>:{<digest of
policy, caller, model>}:n / :ncd / :nev). The history is a sorted set of
the caller's recent hits, each member a unique time stamp and its
signature (112 hex digits, last: an 8-digit anchor, an 8-digit payload,
then 6 words of 32 two-bit bins), scored by Redis time, at most <capacity>
of them; the count is the hits in the window near this one, this one
included: the same anchor, and the same payload (not 0) or at least
<min_matches> of the 192 bins agreeing (the filter turns near_similarity
into that count, so both decide in integers alike).
Cooldowns are kept per signature (a sorted set scored by the time each
ends, at most 8), so a cooldown holds its loop, not the caller; so is the
event state (a hash of signature -> "last:suppressed", at most 8 loops),
so each loop is reported.

  FCALL loopguard_forgive 2 <log key> <forgiven key> <nonce> <window_ms> <max>

An attempt the provider failed (the filter saw a 5xx or 429 answer): take
its hit (the log member carrying <nonce>) back out of the log, unless
<max> attempts like it (any of an exact fingerprint's; the same signature
in a near record) were taken back within the window (the forgiven key, a
sorted set of what was taken back, scored by time, at most 16).
Returns 1 (taken back), 0 (over the budget: it stays counted) or -1 (no
such hit: it left the window or the log).

Both return {count, until_allowed_ms, cooldown_remaining_ms, event}:
  count                  identical hits in the window, this one included
                         (at most <capacity>)
  until_allowed_ms       until a further request would stay below <trip_at>
  cooldown_remaining_ms  cooldown left (0 for none)
  event                  -1, or the number of detections suppressed since the
                         last reported one when this hit is to be reported

  FCALL loopguard_budget <n> <budget key 1> .. <budget key n>
        <now_ms> <slice_ms 1> <add 1> <cap 1> .. <slice_ms n> <add n> <cap n>

Budgets (spend caps): each key a hash of a budget key's spending over a
sliding window kept as 60 slices (field: the absolute slice number
floor(t / slice_ms) in decimal, value: the amount spent in it). The caller
gives the time (<now_ms>: its clock, so every slice is the same as in its
local table), and for each key its slice length, what to add now (0: only
check) and its cap (0: none). Slices before floor(now / slice_ms) - 59 are
dropped, <add> goes to the current slice, and the answer is the flat list
{total 1, until_below_ms 1, .., total n, until_below_ms n}: the spending in
the window, and the milliseconds until it is below the cap if no more is
spent (0 when it already is or there is no cap). The keys of one request
share a hash tag (lg:<plugin name>:{b<caller>}:<key>), so one call checks
them all on one shard. Every number is below 2^53 (Lua numbers count exactly there).

  FCALL loopguard_mcp 2 <history key> <last-real key> <window_ms> <now_ms> [<entry> <flags>]

MCP call histories: the history key is a list of a caller's (or session's)
newest calls, at most 16, each "<call>:<result>:<content>:<flags>" in hex
digits (digests only); the last-real key holds when the newest call the
server answered was added (the caller's <now_ms>). Both share a hash tag
(lg:<plugin name>:{m<history>}:h / :r) and expire <window_ms> after the
last call added, so a history idle that long is gone. With an entry, it is
added (<flags>: 1 failed, 2 unread, 4 answered by loopguard; an unread call
starts no history of its own) and 1 is returned; without, the answer is
{last_real_ms, entry 1, .., entry n}, oldest first.
]]

local day_ms = 86400000

-- The same bounds as loopguard's configuration validation: whoever can
-- reach webdis cannot make a log longer or a key live longer than a policy
-- could.
local function window_args(args)
  local a = {
    window_ms = tonumber(args[1]),
    capacity = tonumber(args[2]),
    trip_at = tonumber(args[3]),
    cooldown_ms = tonumber(args[4]),
    detect_at = tonumber(args[5]),
    event_every_ms = tonumber(args[6]),
    nonce = args[7],
  }
  if not (a.window_ms and a.capacity and a.trip_at and a.cooldown_ms and a.detect_at and a.event_every_ms and a.nonce)
      or a.window_ms < 1 or a.window_ms > day_ms or a.capacity < 1 or a.capacity > 1024
      or a.trip_at < 1 or a.trip_at > 1025 or a.cooldown_ms < 0 or a.cooldown_ms > day_ms
      or a.detect_at < 1 or a.event_every_ms < 0 or a.event_every_ms > day_ms or #a.nonce > 64 then
    return nil
  end
  return a
end

-- Redis's clock in milliseconds, and a stamp in microseconds (zero-padded,
-- so stamps of one millisecond sort in time order).
local function now_ms()
  local t = redis.call('TIME')
  local us = tonumber(t[2])
  return tonumber(t[1]) * 1000 + math.floor(us / 1000), t[1] .. string.format('%06d', us)
end

-- Cooldowns and event states a near record keeps per loop, at most.
local max_loops = 8

-- Record a hit in a sliding log (a sorted set scored by time): a hit at t
-- is in the window while now - t < window; at most <capacity> of them, the
-- oldest dropped first. Returns the hits in the log.
local function push_log(key, member, now, a)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now - a.window_ms)
  redis.call('ZADD', key, now, member)
  local count = redis.call('ZCARD', key)
  if count > a.capacity then
    redis.call('ZREMRANGEBYRANK', key, 0, count - a.capacity - 1)
    count = a.capacity
  end
  redis.call('PEXPIRE', key, a.window_ms)
  return count
end

-- Milliseconds until the hit at `t`, the (trip_at - 1)th newest, leaves
-- the window. A hit stamped in the future (a failover to a server whose
-- clock is behind) counts as now, as in loopguard's local table.
local function allowed_after(t, now, a)
  return math.max(0, math.min(t, now) + a.window_ms - now)
end

-- Allowed again once the (trip_at - 1)th newest hit leaves the window.
-- `times` are the counted hits, oldest first.
local function until_allowed(times, now, a)
  local k = a.trip_at - 1
  local count = #times
  if k > 0 and count >= k then
    return allowed_after(times[count - k + 1], now, a)
  end
  return 0
end

-- An event state "last:suppressed": when a detection was last reported
-- (0: never) and how many were not reported since.
local function parse_state(value, now)
  local sep = value and string.find(value, ':', 1, true)
  if not sep then
    return 0, 0
  end
  return math.min(tonumber(string.sub(value, 1, sep - 1)) or 0, now),
      tonumber(string.sub(value, sep + 1)) or 0
end

-- A detection, reported once per interval and counted otherwise: the
-- event (the detections suppressed since the last report, or -1) and the
-- state to keep.
local function next_state(last, suppressed, now, a)
  if last == 0 or now - last >= a.event_every_ms then
    return suppressed, now .. ':0'
  end
  return -1, last .. ':' .. (suppressed + 1)
end

-- Report a detection once per record and interval; count the rest.
local function report(event_key, detected, now, a)
  if not detected then
    return -1
  end
  local last, suppressed = parse_state(redis.call('GET', event_key), now)
  local event, state = next_state(last, suppressed, now, a)
  redis.call('SET', event_key, state, 'PX', math.max(a.event_every_ms, a.window_ms))
  return event
end

local function hit(keys, args)
  local window_key, cooldown_key, event_key = keys[1], keys[2], keys[3]
  local a = window_args(args)
  if not a then
    return redis.error_reply('loopguard: bad arguments')
  end
  local now, stamp = now_ms()

  local count = push_log(window_key, stamp .. ':' .. a.nonce, now, a)

  -- Allowed again once the (trip_at - 1)th newest hit leaves the window.
  local allowed = 0
  local k = a.trip_at - 1
  if k > 0 and count >= k then
    local nth = redis.call('ZRANGE', window_key, count - k, count - k, 'WITHSCORES')
    allowed = allowed_after(tonumber(nth[2]), now, a)
  end

  -- The cooldown starts when trip_at is reached and none is running; hits
  -- during it do not extend it.
  local remaining = 0
  local cooldown_until = tonumber(redis.call('GET', cooldown_key) or '0')
  if cooldown_until > now then
    remaining = math.min(cooldown_until - now, a.cooldown_ms)
  elseif a.cooldown_ms > 0 and count >= a.trip_at then
    redis.call('SET', cooldown_key, now + a.cooldown_ms, 'PX', a.cooldown_ms)
    remaining = a.cooldown_ms
  end

  local event = report(event_key, count >= a.detect_at or remaining > 0, now, a)
  return {count, allowed, remaining, event}
end

-- Bits set in a 32-bit value (LuaBitOp works on 32-bit integers).
local function popcount(x)
  local n = 0
  while x ~= 0 do
    x = bit.band(x, x - 1)
    n = n + 1
  end
  return n
end

-- A signature: 112 hex digits, the anchor (8), the payload (8), then 6
-- bin words (16 each).
local sig_len = 112
local halves = 12

-- The bins (as 12 32-bit halves) of a signature, or nil if unreadable.
local function bin_words(s)
  if type(s) ~= 'string' or #s ~= sig_len then
    return nil
  end
  local words = {}
  for i = 0, halves - 1 do
    local w = tonumber(string.sub(s, 17 + 8 * i, 24 + 8 * i), 16)
    if not w then
      return nil
    end
    words[i + 1] = w
  end
  return words
end

-- Bins on which two signatures' halves agree (a bin is 2 bits; it differs
-- when either of its bits does).
local function agreeing(a, b)
  local m = 0
  for i = 1, halves do
    local x = bit.bxor(a[i], b[i])
    local differ = bit.band(bit.bor(x, bit.rshift(x, 1)), 0x55555555)
    m = m + 16 - popcount(differ)
  end
  return m
end

local function near(keys, args)
  local history_key, cooldowns_key, events_key = keys[1], keys[2], keys[3]
  local a = window_args(args)
  local signature, min_matches = args[8], tonumber(args[9])
  if not a or type(signature) ~= 'string' or #signature ~= sig_len or not string.match(signature, '^%x+$')
      or not min_matches or min_matches < 1 or min_matches > 192 then
    return redis.error_reply('loopguard: bad arguments')
  end
  signature = string.lower(signature)
  local anchor, payload = string.sub(signature, 1, 8), string.sub(signature, 9, 16)
  local bins = bin_words(signature)
  -- Whether the signature `s` (112 hex digits) is near this hit's: the
  -- same anchor, and the same code (a payload other than 0) or enough
  -- bins agreeing.
  local function near_to(s)
    if string.sub(s, 1, 8) ~= anchor then
      return false
    end
    if payload ~= '00000000' and string.sub(s, 9, 16) == payload then
      return true
    end
    local other = bin_words(s)
    return other ~= nil and agreeing(bins, other) >= min_matches
  end
  -- Bins agreeing with this hit's signature (-1 when not near).
  local function closeness(s)
    if not near_to(s) then
      return -1
    end
    return agreeing(bins, bin_words(s))
  end
  local now, stamp = now_ms()

  -- Members start with the time stamp, so hits of one millisecond still
  -- trim oldest first; the signature is the last 112 characters.
  push_log(history_key, stamp .. ':' .. a.nonce .. ':' .. signature, now, a)
  local entries = redis.call('ZRANGE', history_key, 0, -1, 'WITHSCORES')
  local times = {}
  for i = 1, #entries, 2 do
    if near_to(string.sub(entries[i], -sig_len)) then
      times[#times + 1] = tonumber(entries[i + 1])
    end
  end
  local count = #times
  local allowed = until_allowed(times, now, a)

  redis.call('ZREMRANGEBYSCORE', cooldowns_key, '-inf', now)
  local remaining = 0
  local cooldowns = redis.call('ZRANGE', cooldowns_key, 0, -1, 'WITHSCORES')
  for i = 1, #cooldowns, 2 do
    if near_to(cooldowns[i]) then
      remaining = math.max(remaining, math.min(tonumber(cooldowns[i + 1]) - now, a.cooldown_ms))
    end
  end
  if remaining == 0 and a.cooldown_ms > 0 and count >= a.trip_at then
    redis.call('ZADD', cooldowns_key, now + a.cooldown_ms, signature)
    local m = redis.call('ZCARD', cooldowns_key)
    if m > max_loops then
      redis.call('ZREMRANGEBYRANK', cooldowns_key, 0, m - max_loops - 1)
    end
    remaining = a.cooldown_ms
  end
  local last = redis.call('ZRANGE', cooldowns_key, -1, -1, 'WITHSCORES')
  if last[2] then
    redis.call('PEXPIRE', cooldowns_key, math.max(1, tonumber(last[2]) - now))
  end

  -- Report each loop once per interval: the event state of the nearest
  -- near loop, or a new one.
  local event = -1
  if count >= a.detect_at or remaining > 0 then
    local keep = math.max(a.event_every_ms, a.window_ms)
    local states = redis.call('HGETALL', events_key)
    local best, best_close, best_last, best_suppressed = nil, -1, 0, 0
    local kept, oldest, oldest_last = 0, nil, nil
    for i = 1, #states, 2 do
      local field = states[i]
      local last, suppressed = parse_state(states[i + 1], now)
      if suppressed == 0 and now - last >= keep then
        redis.call('HDEL', events_key, field)
      else
        kept = kept + 1
        -- The nearest loop, and the oldest; of equals, the least
        -- signature (the hash's order is arbitrary, the table's is not).
        local c = closeness(field)
        if c > best_close or (c == best_close and c >= 0 and field < best) then
          best, best_close, best_last, best_suppressed = field, c, last, suppressed
        end
        if oldest_last == nil or last < oldest_last or (last == oldest_last and field < oldest) then
          oldest, oldest_last = field, last
        end
      end
    end
    if not best then
      if kept >= max_loops and oldest then
        redis.call('HDEL', events_key, oldest)
      end
      best, best_last, best_suppressed = signature, 0, 0
    end
    local state
    event, state = next_state(best_last, best_suppressed, now, a)
    redis.call('HSET', events_key, best, state)
    redis.call('PEXPIRE', events_key, keep)
  end
  return {count, allowed, remaining, event}
end

-- Take back the hit logged with <nonce> (its attempt was failed by the
-- provider), within the budget of attempts like it: every attempt of an
-- exact fingerprint's log, the same signature in a near record (a retry
-- repeats its attempt; a caller's other requests keep their own budget).
local function forgive(keys, args)
  local log_key, forgiven_key = keys[1], keys[2]
  local nonce, window_ms, max = args[1], tonumber(args[2]), tonumber(args[3])
  if type(nonce) ~= 'string' or #nonce == 0 or #nonce > 64 or string.find(nonce, ':', 1, true)
      or not window_ms or window_ms < 1 or window_ms > day_ms or not max or max < 0 or max > 16 then
    return redis.error_reply('loopguard: bad arguments')
  end
  local now = now_ms()
  -- A member is "<stamp>:<nonce>" or "<stamp>:<nonce>:<signature>".
  local found, at, signature = nil, nil, nil
  local entries = redis.call('ZRANGE', log_key, 0, -1, 'WITHSCORES')
  for i = 1, #entries, 2 do
    local member = entries[i]
    local rest = string.sub(member, (string.find(member, ':', 1, true) or 0) + 1)
    if rest == nonce then
      found, at = member, tonumber(entries[i + 1])
      break
    elseif string.sub(rest, 1, #nonce + 1) == nonce .. ':' then
      found, at, signature = member, tonumber(entries[i + 1]), string.sub(rest, #nonce + 2)
      break
    end
  end
  -- A hit that has left the window counts no more: nothing to take back
  -- (whether or not a later hit has trimmed it from the log yet).
  if not found or now - math.min(at, now) >= window_ms then
    return -1
  end
  redis.call('ZREMRANGEBYSCORE', forgiven_key, '-inf', now - window_ms)
  local alike = 0
  for _, member in ipairs(redis.call('ZRANGE', forgiven_key, 0, -1)) do
    if signature == nil or string.sub(member, -#signature) == signature then
      alike = alike + 1
    end
  end
  if alike >= max then
    return 0
  end
  redis.call('ZREM', log_key, found)
  redis.call('ZADD', forgiven_key, now, signature and (nonce .. ':' .. signature) or nonce)
  -- What is remembered is bounded, like the table's record.
  local kept = redis.call('ZCARD', forgiven_key)
  if kept > 16 then
    redis.call('ZREMRANGEBYRANK', forgiven_key, 0, kept - 17)
  end
  redis.call('PEXPIRE', forgiven_key, window_ms)
  return 1
end

-- Budgets: a key's spending as slices of a sliding window, the same
-- arithmetic as loopguard's local table (crates/core/src/state/budget/
-- slices.rs). A spend in slice i counts while the current slice is less
-- than budget_slices later.
local budget_slices = 60
-- Amounts, caps and times are Lua numbers (doubles): exact integers below
-- 2^53, where floor(now / slice_ms) is exact too. Any larger argument reads
-- as 2^53 or more, so it is refused.
local max_amount = 9007199254740991
-- A budget's window is at most 31 days (loopguard's configuration
-- bound): a slice of 44,640,000 ms, an expiry of 61 slices (about 31.5
-- days); slice numbers and waits stay exact (now / slice_ms is below 2^53).
local max_budget_window_ms = 31 * day_ms
local max_slice_ms = max_budget_window_ms / budget_slices

-- A whole number in decimal digits, at most `max` (nil otherwise).
local function whole(s, max)
  if type(s) ~= 'string' or #s == 0 or #s > 16 or not string.match(s, '^%d+$') then
    return nil
  end
  local n = tonumber(s)
  if n > max then
    return nil
  end
  return n
end

local function slice_field(i)
  return string.format('%d', i)
end

-- A slice's stored amount: HINCRBY keeps it an exact 64-bit integer; past
-- 2^53 the sums below round (no policy's cap comes near).
local function stored_amount(v)
  if type(v) ~= 'string' or #v == 0 or #v > 19 or not string.match(v, '^%d+$') then
    return nil
  end
  return tonumber(v)
end

-- One budget key: drop the slices that left the window, add <add> to the
-- current one, and answer the total and the wait until it is below <cap>.
local function budget_key(key, now, slice_ms, add, cap)
  local current = math.floor(now / slice_ms)
  local first = math.max(0, current - (budget_slices - 1))
  -- {slice, amount, field} of the slices still in the window.
  local kept = {}
  local fields = redis.call('HGETALL', key)
  for i = 1, #fields, 2 do
    local field = fields[i]
    local slice, amount = whole(field, max_amount), stored_amount(fields[i + 1])
    if not slice or not amount or slice < first or field ~= slice_field(slice) then
      redis.call('HDEL', key, field)
    else
      kept[#kept + 1] = {slice, amount, field}
    end
  end
  if add > 0 then
    local field = slice_field(current)
    local amount = tonumber(redis.call('HINCRBY', key, field, add))
    local found = false
    for _, e in ipairs(kept) do
      if e[1] == current then
        e[2], found = amount, true
      end
    end
    if not found then
      kept[#kept + 1] = {current, amount, field}
    end
    -- A writer whose clock is far ahead may have left slices past the
    -- current one: keep the newest budget_slices, as the local table does.
    if #kept > budget_slices then
      table.sort(kept, function(a, b) return a[1] > b[1] end)
      for i = #kept, budget_slices + 1, -1 do
        redis.call('HDEL', key, kept[i][3])
        kept[i] = nil
      end
    end
  end
  table.sort(kept, function(a, b) return a[1] < b[1] end)
  local total = 0
  for _, e in ipairs(kept) do
    total = total + e[2]
  end
  -- Below the cap once enough of the oldest slices have left the window
  -- (slice i leaves when slice i + budget_slices begins).
  local wait = 0
  if cap > 0 and total >= cap then
    local left = total
    for _, e in ipairs(kept) do
      left = left - e[2]
      if left < cap then
        wait = math.max(0, (e[1] + budget_slices) * slice_ms - now)
        break
      end
    end
  end
  -- The newest slice counts for budget_slices slices: one more, so a
  -- Redis clock slightly ahead of the caller's forgets nothing early
  -- (a no-op when the key holds nothing).
  redis.call('PEXPIRE', key, (budget_slices + 1) * slice_ms)
  return total, wait
end

local function budget(keys, args)
  local now = whole(args[1], max_amount)
  if not now or #args ~= 1 + 3 * #keys then
    return redis.error_reply('loopguard: bad arguments')
  end
  -- Every argument is read before anything is written (a script is not
  -- rolled back when it fails half way).
  local specs = {}
  for k = 1, #keys do
    local slice_ms = whole(args[3 * k - 1], max_slice_ms)
    local add, cap = whole(args[3 * k], max_amount), whole(args[3 * k + 1], max_amount)
    if not slice_ms or slice_ms < 1 or not add or not cap then
      return redis.error_reply('loopguard: bad arguments')
    end
    specs[k] = {slice_ms, add, cap}
  end
  local out = {}
  for k = 1, #keys do
    local s = specs[k]
    local total, wait = budget_key(keys[k], now, s[1], s[2], s[3])
    out[#out + 1] = total
    out[#out + 1] = wait
  end
  return out
end

-- MCP call histories (see the header).
local mcp_max_entries = 16

local function mcp(keys, args)
  local window_ms = whole(args[1], day_ms)
  local now = whole(args[2], max_amount)
  if #keys ~= 2 or not window_ms or window_ms < 1 or not now or (#args ~= 2 and #args ~= 4) then
    return redis.error_reply('loopguard: bad arguments')
  end
  if #args == 2 then
    local out = {tonumber(redis.call('GET', keys[2]) or '0') or 0}
    for _, e in ipairs(redis.call('LRANGE', keys[1], 0, -1)) do
      out[#out + 1] = e
    end
    return out
  end
  local entry, flags = args[3], whole(args[4], 7)
  if not flags or #entry > 80 or not string.match(entry, '^[0-9a-f]+:[0-9a-f]+:[0-9a-f]+:[0-9a-f]+$') then
    return redis.error_reply('loopguard: bad arguments')
  end
  local unread, answered = math.floor(flags / 2) % 2 == 1, flags >= 4
  if unread and redis.call('EXISTS', keys[1]) == 0 then
    return 1
  end
  redis.call('RPUSH', keys[1], entry)
  redis.call('LTRIM', keys[1], -mcp_max_entries, -1)
  redis.call('PEXPIRE', keys[1], window_ms)
  if answered then
    redis.call('PEXPIRE', keys[2], window_ms)
  else
    redis.call('SET', keys[2], string.format('%d', now), 'PX', window_ms)
  end
  return 1
end

redis.register_function('loopguard_hit', hit)
redis.register_function('loopguard_near', near)
redis.register_function('loopguard_forgive', forgive)
redis.register_function('loopguard_budget', budget)
redis.register_function('loopguard_mcp', mcp)
