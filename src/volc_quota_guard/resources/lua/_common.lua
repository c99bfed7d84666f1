-- Shared prelude, prepended to every gate script (see gate.py).
-- KEYS: 1 state (hash), 2 reservations (hash id -> "amount:deadline:est:est_reserved[:x]"), 3 deadlines (zset),
--       4 resolved (hash id -> "how:counted"), 5 resolved_at (zset), 6 timeline (hash minute -> usage),
--       7 timeline index (zset).  Amounts are tokens, times are ms since the epoch.
local unpack = unpack or table.unpack  -- Lua 5.1 in Redis, 5.4 in the embedded store
local K_STATE, K_RES, K_DL, K_DONE, K_DONE_AT, K_TL, K_TL_IDX =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]

local MAX_REQUEST = 100000000          -- tokens in one request or settle
local MAX_AMOUNT = 1000000000000000    -- tokens in a snapshot field
local MAX_TIME = 4102444800000         -- 2100-01-01: also "evicted until the next snapshot"
local RESOLVED_MS = 21600000           -- resolved ids live 6 h: a later settle is counted again (safe)
local TIMELINE_MS = 172800000          -- timeline minutes live 48 h
local SWEEP_LIMIT = 1000               -- expired reservations swept per call
-- A reservation expires only when its process died (a live one renews it), and its call may go
-- on at Ark for hours: one swept this close to Beijing midnight is also counted on the next day.
local CARRY_MS = RESOLVED_MS
local TRIM_LIMIT = 100                 -- old ids / minutes trimmed per call
-- The estimate correction k (parts per million): measured / estimated prompt tokens.
local PPM = 1000000
local CORR_HALF_LIFE_MS = 86400000     -- k's excess over 1.0 halves per day without a new peak
local CORR_MIN_INPUT = 200             -- smaller estimates are mostly chat-template overhead
local CORR_MIN, CORR_MAX = 1700000, 3000000  -- defaults when a snapshot does not say
-- An exact count (Ark's tokenization API) is its own class: its own learned correction kx, at
-- least XCORR_FLOOR (template and version drift), learning up to the pool's corr_max; in the
-- miscount risk its prompts are held to XCORR_CEIL (an exact count is off by drift, not 3x).
local XCORR_FLOOR, XCORR_CEIL = 1100000, 1500000

local function int_arg(v, lo, hi)
  if type(v) ~= 'string' or #v == 0 or #v > 16 or not string.match(v, '^%d+$') then return nil end
  local n = tonumber(v)
  if n < lo or n > hi then return nil end
  return n
end

local function err(code, msg) return {'error', code, msg} end

local function read_now(v)
  if v == '' then
    local t = redis.call('TIME')
    return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return int_arg(v, 0, MAX_TIME)
end

local function valid_id(id) return type(id) == 'string' and #id >= 1 and #id <= 256 end

local function day_of(ms) return math.floor((ms + 28800000) / 86400000) end  -- Beijing day

local FIELDS = {'snap_at', 'valid_until', 'balance', 'settled', 'expiring', 'buffer', 'cap',
  'evict_below', 'ucum', 'day', 'day_usage', 'prev_day_usage', 'inflight', 'overruns',
  'expired_count', 'evicted_until', 'tl_floor', 'snap_seq', 'corr', 'corr_at', 'corr_n',
  'corr_min', 'corr_max', 'inflight_est', 'inflight_est_res',
  -- Where the pool's history begins (ms; 1 = before this field existed): set once, when the
  -- state is created, so it doubles as the state's generation. A hold (hold_until > 0) keeps
  -- lifetime usage under hold_cap until a snapshot without one; hist_lost = a process saw the
  -- previous generation (lost state, not a first start). On the Beijing day day_lost the daily
  -- cap is lowered by day_margin: usage of that day the guard did not see.
  'hist_at', 'hist_lost', 'hold_until', 'hold_cap', 'day_lost', 'day_margin',
  -- Today's count reconciled from the billing API (snapshot.lua): on Beijing day dr_day, today's
  -- usage up to the API's settled-through point is at most dr_chain, what came later at most what
  -- the guard counted since its lifetime usage was dr_from; the lowest such bound a sync found,
  -- dr_best at lifetime usage dr_ucum, is what the cap counts (plus what was counted since).
  'dr_day', 'dr_chain', 'dr_from', 'dr_best', 'dr_ucum',
  -- Lifetime usage counted without a measurement (a reservation kept whole: usage missing, or
  -- expired): the timeline carries it so the lag observer can read what surely ran.
  'unsure',
  -- The exact-count class (reserve's 'exact'): its peak ratio, when and how often measured, and
  -- the in-flight sums of its estimated and reserved input (the fields above are the cheap class).
  'xcorr', 'xcorr_at', 'xcorr_n', 'inflight_xest', 'inflight_xest_res',
  -- When the billing listing behind the installed snapshot began (snapshot.lua: none older).
  'listed_at',
  -- Expired reservations (a dead process's calls) that Ark may bill on Beijing day carry_day;
  -- and what a lost generation carried to lost_carry_day (recover.lua: a wipe lost it).
  'carry_day', 'carry', 'lost_carry_day', 'lost_carry'}

-- Text fields: the wall eviction is for; the expiry ladder (snapshot.lua, "t:a,t:a": free tokens
-- that expire after the snapshot's own lookahead, by expiry time).
local LOAD_FIELDS = {unpack(FIELDS)}
LOAD_FIELDS[#LOAD_FIELDS + 1] = 'evicted_wall'
LOAD_FIELDS[#LOAD_FIELDS + 1] = 'ladder'

-- One read of the whole state; `exists` is false for a pool that never had a snapshot.
local function load()
  local vals = redis.call('HMGET', K_STATE, unpack(LOAD_FIELDS))
  local st = {exists = vals[1] ~= false and vals[1] ~= nil}
  for i, f in ipairs(FIELDS) do st[f] = tonumber(vals[i]) or 0 end
  st.evicted_wall = vals[#LOAD_FIELDS - 1] or ''
  st.ladder = vals[#LOAD_FIELDS] or ''
  return st
end

local function save(st)
  local args = {}
  for _, f in ipairs(FIELDS) do
    args[#args + 1] = f
    args[#args + 1] = string.format('%d', st[f])
  end
  args[#args + 1] = 'evicted_wall'
  args[#args + 1] = st.evicted_wall
  args[#args + 1] = 'ladder'
  args[#args + 1] = st.ladder
  redis.call('HSET', K_STATE, unpack(args))
end

-- A reservation record: amount, deadline, estimated input, input reserved for it (k applied),
-- and 'x' when the estimate is an exact count (older records have no class: cheap).
local function parse_res(rec)
  local amount, deadline, est, est_res, class = string.match(rec, '^(%d+):(%d+):?(%d*):?(%d*):?(x?)$')
  return tonumber(amount), tonumber(deadline), tonumber(est) or 0, tonumber(est_res) or 0, class == 'x'
end

-- A measured peak ratio, its excess over 1.0 halved for each day since it was seen.
local function decay(peak, at, now)
  if peak <= PPM then return PPM end
  local halvings = math.min(60, math.floor(math.max(0, now - at) / CORR_HALF_LIFE_MS))
  return PPM + math.floor((peak - PPM) / 2 ^ halvings)
end

-- k now: the decayed peak within [corr_min, corr_max]. The floor is also k before any
-- measurement: it covers a traffic class the pool has not seen yet.
local function correction(st, now)
  return math.min(math.max(decay(st.corr, st.corr_at, now), st.corr_min), st.corr_max)
end

-- The exact class's most: the pool's corr_max (what a measurement may teach), never under its floor.
local function xcorr_max(st) return math.max(st.corr_max, XCORR_FLOOR) end

-- The exact class's miscount ceiling: XCORR_CEIL, at most what kx may learn.
local function xceiling(st) return math.min(XCORR_CEIL, xcorr_max(st)) end

-- kx now: the exact class's decayed peak within [XCORR_FLOOR, xcorr_max].
local function xcorrection(st, now)
  return math.min(math.max(decay(st.xcorr, st.xcorr_at, now), XCORR_FLOOR), xcorr_max(st))
end

local function corrected(est, k) return math.floor((est * k + PPM - 1) / PPM) end  -- ceil(est * k)

-- A measured settle: its ratio becomes its class's peak when it reaches the decayed one.
-- Estimated and missing usage never come here, so they can never lower k or kx.
local function observe(st, est, measured, now, exact)
  if est < CORR_MIN_INPUT then return end
  local top = exact and xcorr_max(st) or st.corr_max
  local ratio = math.min(math.floor((measured * PPM + est - 1) / est), top)
  if exact then
    st.xcorr_n = math.min(st.xcorr_n + 1, 1000000000)
    if ratio >= decay(st.xcorr, st.xcorr_at, now) then st.xcorr, st.xcorr_at = ratio, now end
  else
    st.corr_n = math.min(st.corr_n + 1, 1000000000)
    if ratio >= decay(st.corr, st.corr_at, now) then st.corr, st.corr_at = ratio, now end
  end
  st.k, st.kx = correction(st, now), xcorrection(st, now)
end

-- What a reservation whose usage never came (missing, or expired) is counted as: its output and
-- its prompt at its class's miscount ceiling, as the admission held it (the prompt may have been
-- that much over its count; the day's count and the balance wall take the excess back once the
-- billing API shows the truth). Counting it at k would under-count a class k has not measured.
local function unmeasured(st, amount, est, est_res, exact, now)
  local ceiling = st.corr_max
  if exact then ceiling = math.max(xcorrection(st, now), xceiling(st)) end
  return amount + math.max(0, corrected(est, ceiling) - est_res)
end

-- Add (sign 1) or drop (sign -1) one reservation in the in-flight sums of its class.
local function inflight_add(st, sign, amount, est, est_res, exact)
  st.inflight = st.inflight + sign * amount
  if exact then
    st.inflight_xest = st.inflight_xest + sign * est
    st.inflight_xest_res = st.inflight_xest_res + sign * est_res
  else
    st.inflight_est = st.inflight_est + sign * est
    st.inflight_est_res = st.inflight_est_res + sign * est_res
  end
end

local function unreserve(st, amount, est, est_res, exact) inflight_add(st, -1, amount, est, est_res, exact) end

local function roll_day(st, now)
  local today = day_of(now)
  if today > st.day then  -- never roll back: a clock that goes back keeps today's count
    st.prev_day_usage = (today == st.day + 1) and st.day_usage or 0
    st.day_usage = 0
    st.day = today
  end
end

-- A timeline minute: "lifetime usage:of it unsure" (older entries: just the usage).
local function tl_usage(v) return tonumber(string.match(v or '', '^(%d+)')) or 0 end

local function add_usage(st, n, now, unsure)
  if n <= 0 then return end
  st.ucum = st.ucum + n
  st.day_usage = st.day_usage + n
  if unsure then st.unsure = st.unsure + n end
  local minute = math.floor(now / 60000)
  redis.call('HSET', K_TL, minute, string.format('%d:%d', st.ucum, st.unsure))
  redis.call('ZADD', K_TL_IDX, minute, minute)
end

local function resolve(id, how, counted, now)
  redis.call('HSET', K_DONE, id, how .. ':' .. string.format('%d', counted))
  redis.call('ZADD', K_DONE_AT, now, id)
end

-- Usage counted now of a call Ark may still be running (an expired reservation, a call the
-- proxy gave up on): Ark may bill it after Beijing midnight, so this close to it it also counts
-- on the next day.
local function carry_over(st, counted, now)
  local next_day = day_of(now) + 1
  if day_of(now + CARRY_MS) == next_day then
    if st.carry_day ~= next_day then st.carry_day, st.carry = next_day, 0 end
    st.carry = st.carry + counted
  end
end

-- A reservation past its deadline may have run: count it as consumed.
local function sweep(st, now)
  local ids = redis.call('ZRANGEBYSCORE', K_DL, '-inf', now, 'LIMIT', 0, SWEEP_LIMIT)
  for _, id in ipairs(ids) do
    local rec = redis.call('HGET', K_RES, id)
    redis.call('ZREM', K_DL, id)
    if rec then
      local amount, _, est, est_res, exact = parse_res(rec)
      redis.call('HDEL', K_RES, id)
      unreserve(st, amount, est, est_res, exact)
      local counted = unmeasured(st, amount, est, est_res, exact, now)
      add_usage(st, counted, now, true)
      resolve(id, 'expired', counted, now)
      st.expired_count = st.expired_count + 1
      carry_over(st, counted, now)
    end
  end
end

local function trim(st, now)
  local old = redis.call('ZRANGEBYSCORE', K_DONE_AT, '-inf', now - RESOLVED_MS, 'LIMIT', 0, TRIM_LIMIT)
  for _, id in ipairs(old) do
    redis.call('HDEL', K_DONE, id)
    redis.call('ZREM', K_DONE_AT, id)
  end
  local minutes = redis.call('ZRANGEBYSCORE', K_TL_IDX, '-inf', math.floor((now - TIMELINE_MS) / 60000),
    'LIMIT', 0, TRIM_LIMIT)
  for _, m in ipairs(minutes) do
    local u = tl_usage(redis.call('HGET', K_TL, m))
    if u > st.tl_floor then st.tl_floor = u end
    redis.call('HDEL', K_TL, m)
    redis.call('ZREM', K_TL_IDX, m)
  end
end

local function housekeep(st, now)
  if st.corr_min == 0 then st.corr_min, st.corr_max = CORR_MIN, CORR_MAX end
  roll_day(st, now)
  sweep(st, now)
  trim(st, now)
  st.k, st.kx = correction(st, now), xcorrection(st, now)
end

local function wall_balance(st)
  local wall = st.balance + st.settled - st.expiring - st.buffer
  if st.hold_until > 0 then wall = math.min(wall, st.hold_cap) end
  return wall
end

-- Free tokens of the ladder's packages that expire by `until_ms`: a call Ark may still run
-- then is admitted without them (its tokens would be billed after they are gone).
local function expiring_by(st, until_ms)
  local off = 0
  for t, a in string.gmatch(st.ladder, '(%d+):(%d+)') do
    if tonumber(t) <= until_ms then off = off + tonumber(a) end
  end
  return off
end

-- The daily cap less what the guard did not see of a day its history began in.
local function day_cap(st)
  if st.day_lost > 0 and st.day == st.day_lost then return math.max(0, st.cap - st.day_margin) end
  return st.cap
end

-- Today's usage as the daily cap counts it: the guard's own count, or less where the billing
-- API showed the day used less (usage the guard kept whole because it was never reported).
local function day_count(st)
  local carried = ((st.carry_day == st.day) and st.carry or 0)
    + ((st.lost_carry_day == st.day) and st.lost_carry or 0)
  if st.dr_day ~= st.day then return carried + st.day_usage end
  return carried + math.min(st.day_usage, st.dr_best + math.max(0, st.ucum - st.dr_ucum))
end

-- In-flight requests reserved with a k (kx) lower than today's may each use that much more input.
local function cheap_margin(st) return math.max(0, corrected(st.inflight_est, st.k) - st.inflight_est_res) end
local function exact_margin(st) return math.max(0, corrected(st.inflight_xest, st.kx) - st.inflight_xest_res) end
local function margin(st) return cheap_margin(st) + exact_margin(st) end

-- What the in-flight prompts, plus one of `est` reserved as `est_res` (exact: an exact count),
-- could use beyond what the walls already hold were each cheap count corr_max times too low (a
-- class the pool never measured) and each exact count XCORR_CEIL times (at most corr_max).
local function miscount_risk(st, est, est_res, exact)
  local ce, cr, xe, xr = 0, 0, 0, 0
  if exact then xe, xr = est, est_res else ce, cr = est, est_res end
  local cheap = corrected(st.inflight_est + ce, st.corr_max) - (st.inflight_est_res + cr) - cheap_margin(st)
  local exact_risk = corrected(st.inflight_xest + xe, xceiling(st)) - (st.inflight_xest_res + xr) - exact_margin(st)
  return math.max(0, cheap) + math.max(0, exact_risk)
end

local function headrooms(st)
  local held = st.inflight + margin(st)
  return wall_balance(st) - (st.ucum + held), day_cap(st) - (day_count(st) + held)
end

-- Soft-evict: a pool with less headroom than evict_below leaves routing until the next
-- snapshot (balance wall) or the next Beijing midnight (collection wall).
local function update_eviction(st)
  local hb, hc = headrooms(st)
  if hb < st.evict_below then
    st.evicted_until, st.evicted_wall = MAX_TIME, 'balance'
  elseif hc < st.evict_below then
    st.evicted_until, st.evicted_wall = (st.day + 1) * 86400000 - 28800000, 'collection'
  else
    st.evicted_until, st.evicted_wall = 0, ''
  end
end

-- In-flight prompts at the pool's miscount ceiling beyond what they reserved: what they count
-- if they settle without usage, as every one does when a wipe loses its reservation.
local function inflight_at_ceiling(st)
  local ceiling = st.corr_max > 0 and st.corr_max or 3 * PPM
  return math.max(0, corrected(st.inflight_est, ceiling) - st.inflight_est_res)
    + math.max(0, corrected(st.inflight_xest, ceiling) - st.inflight_xest_res)
end

-- The tail (generation, Beijing day, today's and lifetime usage with in-flight at the ceiling,
-- settled, lifetime usage, the carry to a next day and its day) is what a process remembers of the pool from its latest answer (gate `sighting`):
-- if the state is lost, what it admitted after the sync thread's last poll is not lost too.
local function answer(st, status, reason, amount, overrun, input_reserved)
  local hb, hc = headrooms(st)
  local held = st.inflight + margin(st)
  local worst = st.inflight + inflight_at_ceiling(st)
  return {status, reason, amount, math.min(hb, hc), st.ucum + held, wall_balance(st),
    day_count(st) + held, day_cap(st), st.inflight, st.evicted_until, overrun or 0, st.balance,
    input_reserved or 0, st.k or PPM, st.kx or XCORR_FLOOR,
    st.hist_at, st.day, st.day_usage + worst, st.ucum + worst, st.settled, st.ucum,
    st.carry_day, st.carry}
end
