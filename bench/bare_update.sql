-- bench/bare_update.sql: the floor for a durable row write, a bare primary-key
-- UPDATE on a table with ratebucket.buckets' fillfactor (50).
\set ep random(1, :nbuckets)
UPDATE bare SET tokens = tokens - 1 WHERE id = :ep;
