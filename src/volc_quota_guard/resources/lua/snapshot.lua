-- ARGV: now_ms ('' = server TIME), balance_at_sync, usage_at_sync (settled-usage estimate, lifetime
-- coordinates), expiring (free tokens that expire before valid_until), small_buffer, daily_cap,
-- valid_until_ms, evict_below, packages (JSON, for `status`; KEYS[8]), the estimate correction's
-- floor and bound (ppm; '' = the defaults), hold_until (ms; '' or 0 = no hold) and hold_cap (the
-- most lifetime usage may reach while held), and the tokens of today the guard did not see
-- when this call creates the state ('' = 0); then today's count from the billing API: the
-- consumption the API settled since the previous sync at most ('' = not bounded: count from
-- here), that sync's time (ms, 0 = none) and the guard's lifetime usage a reconcile lag ago;
-- then the generation (hist_at) the snapshot was computed from ('' or 0 = a new state): another
-- generation, or none, is an error ('generation') and nothing is written; then when the billing
-- listing it was computed from began ('' or 0 = unordered: a snapshot by hand): older than the
-- installed one's is an error ('older_listing') and nothing is written — a sync that stalled past
-- its lock must not put back a balance a later sync already saw spent. Last, the expiry ladder
-- ('' = none): "t:a,t:a", free tokens a in packages expiring at t (ms) after valid_until and the
-- longest call, which reserve.lua keeps off the wall of a call Ark may run past t.
-- Installs the pool's snapshot, all of it in one
-- step; counters (and what the correction learned) are kept. The call that creates the state
-- stamps where the pool's history begins (hist_at, also its generation).
local now = read_now(ARGV[1])
if not now then return err('bad_time', 'now must be empty or ms since the epoch') end
local v = {}
for i = 2, 8 do
  v[i] = int_arg(ARGV[i], 0, i == 7 and MAX_TIME or MAX_AMOUNT)
  if not v[i] then return err('bad_amount', 'snapshot field ' .. i - 1 .. ' must be a non-negative integer') end
end
if v[7] <= now then return err('bad_time', 'valid_until must be in the future') end
local corr_min, corr_max = CORR_MIN, CORR_MAX
if ARGV[10] ~= nil and ARGV[10] ~= '' then
  corr_max = int_arg(ARGV[11] or '', PPM, 100 * PPM)
  corr_min = corr_max and int_arg(ARGV[10], PPM, corr_max)
  if not corr_min then return err('bad_amount', 'correction: 1e6 <= min <= max <= 1e8 ppm') end
end

local hold_until, hold_cap, unseen = 0, 0, 0
if ARGV[12] ~= nil and ARGV[12] ~= '' then
  hold_until, hold_cap = int_arg(ARGV[12], 0, MAX_TIME), int_arg(ARGV[13] or '', 0, MAX_AMOUNT)
  if not hold_until or not hold_cap then return err('bad_amount', 'hold: until and cap must be non-negative integers') end
end
if ARGV[14] ~= nil and ARGV[14] ~= '' then
  unseen = int_arg(ARGV[14], 0, MAX_AMOUNT)
  if not unseen then return err('bad_amount', 'unseen day usage must be a non-negative integer') end
end

local function optional(i, hi)  -- '' or absent: nil; else a bounded integer, or false when bad
  if ARGV[i] == nil or ARGV[i] == '' then return nil end
  return int_arg(ARGV[i], 0, hi) or false
end
local step, since, from = optional(15, MAX_AMOUNT), optional(16, MAX_TIME), optional(17, MAX_AMOUNT)
if step == false or since == false or from == false then
  return err('bad_amount', 'day reconcile: step, since and from must be non-negative integers')
end
since = since or 0

local expect = optional(18, MAX_TIME)
if expect == false then return err('bad_amount', 'generation must be a non-negative integer') end
local listed = optional(19, MAX_TIME)
if listed == false then return err('bad_time', 'listed_at must be empty or ms since the epoch') end
local ladder = ARGV[20] or ''
if #ladder > 4096 or not string.match(ladder, '^[%d:,]*$') then
  return err('bad_amount', 'the expiry ladder must be "t:a,t:a" (at most 4096 bytes)')
end
local st = load()
-- A stored listing time ahead of now came from a clock since set back: it orders nothing.
if listed and listed > 0 and st.exists and st.listed_at > listed and st.listed_at <= now then
  return err('older_listing', 'a snapshot from a later billing listing is installed')
end
if expect and expect > 0 and (not st.exists or math.max(st.hist_at, 1) ~= expect) then
  return err('generation', 'the pool state is not the generation this snapshot was computed from')
end
if not st.exists then
  st.day, st.hist_at = day_of(now), now
  -- What ran today before the history began is not seen; a history from midnight misses nothing.
  if unseen > 0 and now > st.day * 86400000 - 28800000 then st.day_lost, st.day_margin = st.day, unseen end
elseif st.hist_at == 0 then
  st.hist_at = 1  -- a state from before history starts were kept: its history is as old as it
end
housekeep(st, now)
st.snap_at, st.balance, st.expiring, st.buffer, st.cap, st.valid_until, st.evict_below =
  now, v[2], v[4], v[5], v[6], v[7], v[8]
st.settled = math.min(v[3], st.ucum)  -- usage not yet recorded cannot have been settled
st.snap_seq = st.snap_seq + 1
st.listed_at = (st.listed_at <= now) and math.max(st.listed_at, listed or 0) or (listed or 0)
st.hold_until, st.hold_cap = hold_until, hold_cap
st.ladder = ladder
st.corr_min, st.corr_max = corr_min, corr_max
st.k, st.kx = correction(st, now), xcorrection(st, now)
-- Today's count (day_count): the chain of what the API settled, from a sync before midnight
-- (nothing of today before it) or from a sync of today whose own count bounds what came before.
-- Each sync's bound (the chain + what was counted since `from`) can only lower the count.
-- Where our history is too short to say what we counted since the API's settled point, the
-- last known point stays (an earlier one: it only counts more).
local counted = day_count(st)
if step and st.dr_day == st.day then
  st.dr_chain, st.dr_from = st.dr_chain + step, from or st.dr_from
elseif step and since > 0 and day_of(since) < st.day then
  st.dr_day, st.dr_chain, st.dr_from = st.day, step, from or st.dr_from
else
  st.dr_day, st.dr_chain, st.dr_from = st.day, st.day_usage + st.inflight, st.ucum
end
st.dr_best = math.min(counted, st.dr_chain + math.max(0, st.ucum - st.dr_from))
st.dr_ucum = st.ucum
update_eviction(st)
save(st)
redis.call('SET', KEYS[8], ARGV[9] or '[]')
return answer(st, 'ok', 'installed', 0)
