-- ARGV: now_ms ('' = server TIME), request id, actual tokens ('' = unknown: the reservation, its
-- prompt at its class's miscount ceiling),
-- measured input tokens ('' = not measured: the estimate correction learns nothing), and
-- 'estimated' when actual is a local estimate (a cut stream): counted as at least a settle
-- without usage would be; 'running' (implied by 'estimated') when Ark may still be running the
-- call (the proxy gave up on it): near Beijing midnight it also counts on the next day.
-- Replaces a reservation by real usage; each request id is counted exactly once.
local now = read_now(ARGV[1])
local id = ARGV[2]
local actual, measured = nil, nil
if not now then return err('bad_time', 'now must be empty or ms since the epoch') end
if not valid_id(id) then return err('bad_id', 'request id must be 1-256 bytes') end
if ARGV[3] ~= '' then
  actual = int_arg(ARGV[3], 0, MAX_REQUEST)
  if not actual then return err('bad_amount', 'actual must be empty or an integer 0-' .. MAX_REQUEST) end
end
if ARGV[4] ~= nil and ARGV[4] ~= '' then
  measured = int_arg(ARGV[4], 0, MAX_REQUEST)
  if not measured then return err('bad_amount', 'measured input must be empty or an integer 0-' .. MAX_REQUEST) end
end

local estimated = ARGV[5] == 'estimated'
local running = estimated or ARGV[5] == 'running'

local st = load()
if not st.exists then return err('unknown_pool', 'pool has no snapshot') end
housekeep(st, now)
local reason, counted, above = nil, 0, false
local live = redis.call('HGET', K_RES, id)
local done = redis.call('HGET', K_DONE, id)
if live then
  local reserved, _, est, est_res, exact = parse_res(live)
  redis.call('HDEL', K_RES, id)
  redis.call('ZREM', K_DL, id)
  unreserve(st, reserved, est, est_res, exact)
  if actual == nil or estimated then
    counted = math.max(actual or 0, unmeasured(st, reserved, est, est_res, exact, now))
  else
    counted = actual
  end
  above = actual ~= nil and actual > reserved
  reason = 'settled'
  add_usage(st, counted, now, actual == nil or estimated)
  if running then carry_over(st, counted, now) end
  resolve(id, 'settled', counted, now)
  if measured and actual then observe(st, est, measured, now, exact) end
elseif done then
  local how, before = string.match(done, '^(%a+):(%d+)$')
  before = tonumber(before)
  if actual and (how == 'expired' or how == 'released') then
    counted = math.max(0, actual - before)  -- an expired reservation was already counted
    above = counted > 0
    reason = 'late_settle'
    add_usage(st, counted, now)
    resolve(id, 'settled', before + counted, now)
  else
    reason = 'duplicate'
  end
else
  counted = actual or 0
  above = counted > 0
  reason = 'unreserved'
  add_usage(st, counted, now)
  resolve(id, 'settled', counted, now)
end
local overrun = 0
local hb, hc = headrooms(st)
if above and (hb < 0 or hc < 0) then
  overrun = 1
  st.overruns = st.overruns + 1
end
update_eviction(st)
save(st)
return answer(st, 'ok', reason, counted, overrun)
