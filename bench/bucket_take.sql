-- bench/bucket_take.sql: ratebucket's take.  Rate and capacity are so high
-- that every take is granted, so every call writes the row.  The endpoint
-- comes from the client as the statement's text parameter, as a worker
-- passes it; the buckets are named '1' to :nbuckets (setup.sql).
\set ep random(1, :nbuckets)
SELECT * FROM ratebucket.bucket_take(:ep, 1e6, 1e6);
