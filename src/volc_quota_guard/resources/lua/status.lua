-- ARGV: now_ms ('' = server TIME).  Housekeeping plus the pool's current walls.
local now = read_now(ARGV[1])
if not now then return err('bad_time', 'now must be empty or ms since the epoch') end
local st = load()
if not st.exists then return {'refused', 'no_snapshot', 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0} end
housekeep(st, now)
update_eviction(st)
save(st)
return answer(st, 'ok', now > st.valid_until and 'stale_snapshot' or 'status', now)
