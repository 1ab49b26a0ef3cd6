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

Returns {count, until_allowed_ms, cooldown_remaining_ms, event}:
  count                  identical hits in the window, this one included
                         (at most <capacity>)
  until_allowed_ms       until a further request would stay below <trip_at>
  cooldown_remaining_ms  cooldown left (0 for none)
  event                  -1, or the number of detections suppressed since the
                         last reported one when this hit is to be reported
]]

local function hit(keys, args)
  local window_key, cooldown_key, event_key = keys[1], keys[2], keys[3]
  local window_ms = tonumber(args[1])
  local capacity = tonumber(args[2])
  local trip_at = tonumber(args[3])
  local cooldown_ms = tonumber(args[4])
  local detect_at = tonumber(args[5])
  local event_every_ms = tonumber(args[6])
  local nonce = args[7]
  -- The same bounds as loopguard's configuration validation: whoever can
  -- reach webdis cannot make a log longer or a key live longer than a
  -- policy could.
  local day_ms = 86400000
  if not (window_ms and capacity and trip_at and cooldown_ms and detect_at and event_every_ms and nonce)
      or window_ms < 1 or window_ms > day_ms or capacity < 1 or capacity > 1024
      or trip_at < 1 or trip_at > 1025 or cooldown_ms < 0 or cooldown_ms > day_ms
      or detect_at < 1 or event_every_ms < 0 or event_every_ms > day_ms or #nonce > 64 then
    return redis.error_reply('loopguard: bad arguments')
  end

  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

  -- The sliding log: a hit at t is in the window while now - t < window.
  redis.call('ZREMRANGEBYSCORE', window_key, '-inf', now - window_ms)
  redis.call('ZADD', window_key, now, t[1] .. t[2] .. ':' .. nonce)
  local count = redis.call('ZCARD', window_key)
  if count > capacity then
    redis.call('ZREMRANGEBYRANK', window_key, 0, count - capacity - 1)
    count = capacity
  end
  redis.call('PEXPIRE', window_key, window_ms)

  -- Allowed again once the (trip_at - 1)th newest hit leaves the window.
  local until_allowed = 0
  local k = trip_at - 1
  if k > 0 and count >= k then
    local nth = redis.call('ZRANGE', window_key, count - k, count - k, 'WITHSCORES')
    -- A hit stamped in the future (a failover to a server whose clock is
    -- behind) counts as now, as in loopguard's local table.
    until_allowed = math.max(0, math.min(tonumber(nth[2]), now) + window_ms - now)
  end

  -- The cooldown starts when trip_at is reached and none is running; hits
  -- during it do not extend it.
  local remaining = 0
  local cooldown_until = tonumber(redis.call('GET', cooldown_key) or '0')
  if cooldown_until > now then
    remaining = math.min(cooldown_until - now, cooldown_ms)
  elseif cooldown_ms > 0 and count >= trip_at then
    redis.call('SET', cooldown_key, now + cooldown_ms, 'PX', cooldown_ms)
    remaining = cooldown_ms
  end

  -- Report a detection once per fingerprint and interval; count the rest.
  local event = -1
  if count >= detect_at or remaining > 0 then
    local state = redis.call('GET', event_key)
    local last, suppressed = 0, 0
    local sep = state and string.find(state, ':', 1, true)
    if sep then
      last = math.min(tonumber(string.sub(state, 1, sep - 1)) or 0, now)
      suppressed = tonumber(string.sub(state, sep + 1)) or 0
    end
    local keep = math.max(event_every_ms, window_ms)
    if last == 0 or now - last >= event_every_ms then
      event = suppressed
      redis.call('SET', event_key, now .. ':0', 'PX', keep)
    else
      redis.call('SET', event_key, last .. ':' .. (suppressed + 1), 'PX', keep)
    end
  end

  return {count, until_allowed, remaining, event}
end

redis.register_function('loopguard_hit', hit)
