-- ARGV: now_ms ('' = server TIME), request id.
-- Frees a live reservation whose request never reached the upstream. An id it does not know is
-- marked released too: a reserve whose answer was lost may still land, and must find it resolved.
local now = read_now(ARGV[1])
local id = ARGV[2]
if not now then return err('bad_time', 'now must be empty or ms since the epoch') end
if not valid_id(id) then return err('bad_id', 'request id must be 1-256 bytes') end

local st = load()
if not st.exists then return err('unknown_pool', 'pool has no snapshot') end
housekeep(st, now)
local reason, amount = 'unknown_id', 0
local live = redis.call('HGET', K_RES, id)
if live then
  local reserved, _, est, est_res, exact = parse_res(live)
  amount = reserved
  redis.call('HDEL', K_RES, id)
  redis.call('ZREM', K_DL, id)
  unreserve(st, amount, est, est_res, exact)
  resolve(id, 'released', 0, now)
  reason = 'released'
elseif redis.call('HEXISTS', K_DONE, id) == 1 then
  reason = 'duplicate'
else
  resolve(id, 'released', 0, now)
end
update_eviction(st)
save(st)
return answer(st, 'ok', reason, amount)
