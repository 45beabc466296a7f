-- bench/bucket_take.sql: ratebucket's take.  Rate and capacity are so high
-- that every take is granted, so every call writes the row.
\set ep random(1, :nbuckets)
SELECT * FROM ratebucket.bucket_take('ep' || :ep, 1e6, 1e6);
