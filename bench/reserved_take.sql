-- bench/reserved_take.sql: bucket_take of one configured endpoint with a
-- token reserve (bucket_reserve, setup.sql), limits so high that every take
-- is granted: most takes draw from shared memory, one in a batch refills it
-- from the row.  Run in the hot case only; :ep is drawn like every other
-- variant's, and unused.
\set ep random(1, :nbuckets)
SELECT * FROM ratebucket.bucket_take('reserved');
