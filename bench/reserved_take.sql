-- bench/reserved_take.sql: bucket_take of one configured endpoint with a
-- token reserve (bucket_reserve, setup.sql), limits so high that every take
-- is granted.  The bucket then stays nearly full: the reserve's tokens last
-- while a refill's lease does (ratebucket.reserve_lease), and the takes draw
-- from shared memory but for about one row write per lease
-- (doc/reserves.md).  Run in the hot case only; :ep is drawn like every
-- other variant's, and unused.
\set ep random(1, :nbuckets)
SELECT * FROM ratebucket.bucket_take('reserved');
