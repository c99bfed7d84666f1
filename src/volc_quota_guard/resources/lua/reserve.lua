-- ARGV: now_ms ('' = server TIME), request id, amount wanted, least amount acceptable, ttl_ms,
-- estimated input ('' = 0: the part of both amounts that is the tokenizer's prompt count),
-- counting class ('' = cheap; 'exact' = an exact count, e.g. Ark's tokenization API),
-- 'renew' = only move a live reservation's deadline (a request still running), never admit;
-- how long Ark may run the call ('' = 0: within the snapshot's own lookahead): the ladder's
-- packages expiring by now plus this are off its balance wall.
-- The estimated input is reserved as ceil(est * k) (exact: kx); grants min(wanted, headroom)
-- when that is at least the least acceptable amount (both with k applied), and only while the
-- walls would hold were every in-flight prompt miscounted by its class's ceiling.
local now = read_now(ARGV[1])
local id = ARGV[2]
local wanted = int_arg(ARGV[3], 1, MAX_REQUEST)
local least = wanted and int_arg(ARGV[4], 1, wanted)
local ttl = int_arg(ARGV[5], 1000, 604800000)
local est = (ARGV[6] == nil or ARGV[6] == '') and 0 or (least and int_arg(ARGV[6], 0, least))
if not now then return err('bad_time', 'now must be empty or ms since the epoch') end
if not valid_id(id) then return err('bad_id', 'request id must be 1-256 bytes') end
if not wanted or not least or not est then
  return err('bad_amount', 'amounts must be integers, 0 <= input <= least <= wanted <= ' .. MAX_REQUEST)
end
if not ttl then return err('bad_ttl', 'ttl must be 1000-604800000 ms') end
local class = ARGV[7] or ''
if class ~= '' and class ~= 'exact' then return err('bad_class', "counting class must be '' or 'exact'") end
local exact = class == 'exact'
local renew = ARGV[8] == 'renew'
local run = (ARGV[9] == nil or ARGV[9] == '') and 0 or int_arg(ARGV[9], 0, MAX_TIME)
if not run then return err('bad_time', 'the run must be empty or ms') end

local st = load()
if not st.exists then return {'refused', 'no_snapshot', 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0} end
housekeep(st, now)
local reason, granted, status, est_res = nil, 0, 'refused', corrected(est, exact and st.kx or st.k)
local live = redis.call('HGET', K_RES, id)
if live then
  local amount, deadline, held_est, held_res, held_exact = parse_res(live)
  status, reason, granted, est_res = 'ok', 'duplicate', amount, held_res
  if now + ttl > deadline then  -- asked again while it runs: the deadline moves on
    redis.call('HSET', K_RES, id, string.format('%d:%d:%d:%d', amount, now + ttl, held_est, held_res)
      .. (held_exact and ':x' or ''))
    redis.call('ZADD', K_DL, now + ttl, id)
  end
elseif renew then
  reason = 'unknown_id'
elseif redis.call('HEXISTS', K_DONE, id) == 1 then
  reason = 'resolved'
elseif now > st.valid_until then
  reason = 'stale_snapshot'
else
  local extra = est_res - est
  local hb, hc = headrooms(st)
  -- Even were every in-flight prompt corr_max times its count, usage stays within the true free
  -- balance (the wall plus the buffer) and the daily cap: this bounds a first wave of a class
  -- the pool has never measured, before any settle can raise k.
  local risk = miscount_risk(st, est, est_res, exact)
  hb, hc = math.min(hb, hb + st.buffer - risk), math.min(hc, hc - risk)
  local off = (run > 0 and st.ladder ~= '') and expiring_by(st, now + run) or 0
  local grant = math.min(wanted + extra, hb - off, hc)
  if grant >= least + extra then
    status, reason, granted = 'ok', 'admitted', grant
    redis.call('HSET', K_RES, id, string.format('%d:%d:%d:%d', grant, now + ttl, est, est_res)
      .. (exact and ':x' or ''))
    redis.call('ZADD', K_DL, now + ttl, id)
    inflight_add(st, 1, grant, est, est_res, exact)
  elseif off > 0 and math.min(hb, hc) >= least + extra then
    reason = 'expiry_wall'  -- it fits unless Ark runs it past an expiry
  elseif hb <= hc then
    reason = 'balance_wall'
  else
    reason = 'collection_wall'
  end
end
update_eviction(st)
save(st)
return answer(st, status, reason, granted, 0, est_res)
