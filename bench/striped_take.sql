-- bench/striped_take.sql: bucket_take of one configured endpoint striped over
-- BENCH_STRIPES rows (bucket_stripe, setup.sql).  Limits so high that every
-- take is granted.  Run in the hot case only (one endpoint: striping is for
-- one hot endpoint); :ep is drawn like every other variant's, and unused.
\set ep random(1, :nbuckets)
SELECT * FROM ratebucket.bucket_take('striped');
