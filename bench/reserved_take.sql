-- bench/reserved_take.sql: bucket_take of one configured endpoint with a
-- token reserve (bucket_reserve, setup.sql), limits so high that every take
-- is granted.  The bucket then stays nearly full, so what a refill moves to
-- the reserve goes back to the row within about batch / rate seconds: some
-- takes draw from shared memory, the others go through the row and refill
-- it (doc/reserves.md).  Run in the hot case only; :ep is drawn like every
-- other variant's, and unused.
\set ep random(1, :nbuckets)
SELECT * FROM ratebucket.bucket_take('reserved');
