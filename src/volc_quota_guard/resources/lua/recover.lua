-- ARGV: now_ms ('' = server TIME), generation (the hist_at the caller saw the state created
-- with), Beijing day and today's usage (in-flight included) a process last saw in the lost
-- generation; then ('' = none) the Beijing day that process saw usage carried to, how much
-- (calls Ark may bill after midnight), and its calls in flight (at the miscount ceiling).
-- Marks the pool's state as lost (not a first start) and raises today's usage to that
-- checkpoint if it is of today, and the carry: the count the wipe took is not started again
-- from 0, nor the next day's.
local now = read_now(ARGV[1])
if not now then return err('bad_time', 'now must be empty or ms since the epoch') end
local gen, day, seen = int_arg(ARGV[2], 1, MAX_TIME), int_arg(ARGV[3], 0, MAX_TIME), int_arg(ARGV[4], 0, MAX_AMOUNT)
if not gen or not day or not seen then
  return err('bad_amount', 'generation, day and usage must be non-negative integers')
end
local carry_day, carry, inflight = 0, 0, 0
if ARGV[5] ~= nil and ARGV[5] ~= '' then
  carry_day, carry = int_arg(ARGV[5], 0, MAX_TIME), int_arg(ARGV[6] or '', 0, MAX_AMOUNT)
  inflight = int_arg(ARGV[7] or '0', 0, MAX_AMOUNT)
  if not carry_day or not carry or not inflight then
    return err('bad_amount', 'carry day, carry and in-flight must be non-negative integers')
  end
end
local st = load()
if not st.exists then return err('unknown_pool', 'pool has no snapshot') end
housekeep(st, now)
local reason, raised = 'generation', 0
if st.hist_at == gen then
  reason = 'recovered'
  st.hist_lost = 1
  -- What the lost generation counts on today and on tomorrow: its usage of the checkpoint's day
  -- (in flight included), what it carried, and its calls in flight near a midnight (Ark may
  -- bill them after it, and the wipe took their reservations and so their carry).
  local today, tomorrow = (day == st.day) and seen or 0, 0
  if carry_day == st.day then today = today + carry end
  if carry_day == st.day + 1 then tomorrow = tomorrow + carry end
  if inflight > 0 and day > 0 and day_of(now + CARRY_MS) > day then
    if day + 1 == st.day then today = today + inflight end
    if day == st.day then tomorrow = tomorrow + inflight end
  end
  if today > st.day_usage then
    raised = today - st.day_usage
    st.day_usage = today
    if st.dr_day == st.day then  -- the reconciled count too
      st.dr_chain, st.dr_best = st.dr_chain + raised, st.dr_best + raised
    end
  end
  if tomorrow > 0 then
    if st.lost_carry_day ~= st.day + 1 then st.lost_carry_day, st.lost_carry = st.day + 1, 0 end
    st.lost_carry = math.max(st.lost_carry, tomorrow)
  end
end
update_eviction(st)
save(st)
return answer(st, 'ok', reason, raised)
