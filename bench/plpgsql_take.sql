-- bench/plpgsql_take.sql: the same token bucket written in PL/pgSQL
-- (setup.sql), its endpoint passed as bucket_take.sql passes it.
\set ep random(1, :nbuckets)
SELECT * FROM pl_take(:ep, 1e6, 1e6);
