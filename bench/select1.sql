-- bench/select1.sql: the round-trip floor (same \set as the other scripts).
\set ep random(1, :nbuckets)
SELECT 1;
