-- bench/plpgsql_take.sql: the same token bucket written in PL/pgSQL (setup.sql).
\set ep random(1, :nbuckets)
SELECT * FROM pl_take('ep' || :ep, 1e6, 1e6);
