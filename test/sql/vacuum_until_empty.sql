-- VACUUM ratebucket.buckets until it is truncated to nothing, a moment
-- apart, ten times at most: a concurrent ANALYZE's snapshot (autovacuum's
-- among them) can keep the dead rows through one VACUUM.  Included with \i
-- by sql/storage.sql (psql has no loop: the tries are written out).
\o /dev/null
VACUUM ratebucket.buckets;
SELECT pg_relation_size('ratebucket.buckets') > 0 AS vacuum_again \gset
\if :vacuum_again
SELECT pg_sleep(0.3);
VACUUM ratebucket.buckets;
SELECT pg_relation_size('ratebucket.buckets') > 0 AS vacuum_again \gset
\endif
\if :vacuum_again
SELECT pg_sleep(0.3);
VACUUM ratebucket.buckets;
SELECT pg_relation_size('ratebucket.buckets') > 0 AS vacuum_again \gset
\endif
\if :vacuum_again
SELECT pg_sleep(0.3);
VACUUM ratebucket.buckets;
SELECT pg_relation_size('ratebucket.buckets') > 0 AS vacuum_again \gset
\endif
\if :vacuum_again
SELECT pg_sleep(0.3);
VACUUM ratebucket.buckets;
SELECT pg_relation_size('ratebucket.buckets') > 0 AS vacuum_again \gset
\endif
\if :vacuum_again
SELECT pg_sleep(0.3);
VACUUM ratebucket.buckets;
SELECT pg_relation_size('ratebucket.buckets') > 0 AS vacuum_again \gset
\endif
\if :vacuum_again
SELECT pg_sleep(0.3);
VACUUM ratebucket.buckets;
SELECT pg_relation_size('ratebucket.buckets') > 0 AS vacuum_again \gset
\endif
\if :vacuum_again
SELECT pg_sleep(0.3);
VACUUM ratebucket.buckets;
SELECT pg_relation_size('ratebucket.buckets') > 0 AS vacuum_again \gset
\endif
\if :vacuum_again
SELECT pg_sleep(0.3);
VACUUM ratebucket.buckets;
SELECT pg_relation_size('ratebucket.buckets') > 0 AS vacuum_again \gset
\endif
\if :vacuum_again
SELECT pg_sleep(0.3);
VACUUM ratebucket.buckets;
SELECT pg_relation_size('ratebucket.buckets') > 0 AS vacuum_again \gset
\endif
\if :vacuum_again
SELECT pg_sleep(0.3);
VACUUM ratebucket.buckets;
SELECT pg_relation_size('ratebucket.buckets') > 0 AS vacuum_again \gset
\endif
\o
