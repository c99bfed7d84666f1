-- ARGV: now_ms ('' = server TIME), request id, amount wanted, least amount acceptable, ttl_ms.
-- Grants min(wanted, headroom) when that is at least the least acceptable amount.
local now = read_now(ARGV[1])
local id = ARGV[2]
local wanted = int_arg(ARGV[3], 1, MAX_REQUEST)
local least = wanted and int_arg(ARGV[4], 1, wanted)
local ttl = int_arg(ARGV[5], 1000, 604800000)
if not now then return err('bad_time', 'now must be empty or ms since the epoch') end
if not valid_id(id) then return err('bad_id', 'request id must be 1-256 bytes') end
if not wanted or not least then
  return err('bad_amount', 'amounts must be integers, 1 <= least <= wanted <= ' .. MAX_REQUEST)
end
if not ttl then return err('bad_ttl', 'ttl must be 1000-604800000 ms') end

local st = load()
if not st.exists then return {'refused', 'no_snapshot', 0, 0, 0, 0, 0, 0, 0, 0, 0} end
housekeep(st, now)
local reason, granted, status = nil, 0, 'refused'
local live = redis.call('HGET', K_RES, id)
if live then
  status, reason, granted = 'ok', 'duplicate', tonumber(string.match(live, '^(%d+):'))
elseif redis.call('HEXISTS', K_DONE, id) == 1 then
  reason = 'resolved'
elseif now > st.valid_until then
  reason = 'stale_snapshot'
else
  local hb, hc = headrooms(st)
  local grant = math.min(wanted, hb, hc)
  if grant >= least then
    status, reason, granted = 'ok', 'admitted', grant
    redis.call('HSET', K_RES, id, string.format('%d:%d', grant, now + ttl))
    redis.call('ZADD', K_DL, now + ttl, id)
    st.inflight = st.inflight + grant
  elseif hb <= hc then
    reason = 'balance_wall'
  else
    reason = 'collection_wall'
  end
end
update_eviction(st)
save(st)
return answer(st, status, reason, granted)
