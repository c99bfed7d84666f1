-- ARGV: now_ms ('' = server TIME), generation (the hist_at the caller saw the state created
-- with), Beijing day and today's usage (in-flight included) a process last saw in the lost
-- generation.  Marks the pool's state as lost (not a first start) and raises today's usage to
-- that checkpoint if it is of today: the count the wipe took is not started again from 0.
local now = read_now(ARGV[1])
if not now then return err('bad_time', 'now must be empty or ms since the epoch') end
local gen, day, seen = int_arg(ARGV[2], 1, MAX_TIME), int_arg(ARGV[3], 0, MAX_TIME), int_arg(ARGV[4], 0, MAX_AMOUNT)
if not gen or not day or not seen then
  return err('bad_amount', 'generation, day and usage must be non-negative integers')
end
local st = load()
if not st.exists then return err('unknown_pool', 'pool has no snapshot') end
housekeep(st, now)
local reason, raised = 'generation', 0
if st.hist_at == gen then
  reason = 'recovered'
  st.hist_lost = 1
  if day == st.day and seen > st.day_usage then
    raised = seen - st.day_usage
    st.day_usage = seen
    if st.dr_day == st.day then  -- the reconciled count too
      st.dr_chain, st.dr_best = st.dr_chain + raised, st.dr_best + raised
    end
  end
end
update_eviction(st)
save(st)
return answer(st, 'ok', reason, raised)
