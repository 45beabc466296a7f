/* ratebucket--1.7--1.8.sql */

-- ratebucket 1.7 -> 1.8: token reserves in shared memory for hot
-- endpoints.  buckets gets the column reserve (NULL: no reserve, as every
-- endpoint has after the update), bucket_reserve gives an endpoint one and
-- bucket_reserves lists them; both are granted to no one.  A reserve needs
-- the library in shared_preload_libraries.

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION ratebucket UPDATE TO '1.8'" to load this file. \quit

ALTER TABLE ratebucket.buckets ADD COLUMN reserve int;

COMMENT ON COLUMN ratebucket.buckets.reserve IS
'Tokens a refill of the endpoint''s reserve in shared memory moves at most (bucket_reserve); NULL when it has none.';

--
-- Token reserves in shared memory (hot endpoints; the library preloaded)
--

CREATE FUNCTION ratebucket.bucket_reserve(
	endpoint text,
	batch int)
RETURNS int
AS 'MODULE_PATHNAME', 'ratebucket_reserve'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION ratebucket.bucket_reserve(text, int) IS
'Give a configured endpoint a token reserve in shared memory: takes draw from it without writing the row, and the take that finds it empty moves up to batch tokens into it from the row. NULL takes the reserve away. Needs ratebucket in shared_preload_libraries. Returns the batch it had (NULL if none).';

CREATE FUNCTION ratebucket.bucket_reserves(
	OUT endpoint text,
	OUT tokens float8,
	OUT pending float8,
	OUT drawn float8,
	OUT batch int,
	OUT rate float8,
	OUT capacity float8,
	OUT draws bigint,
	OUT tokens_drawn float8,
	OUT refills bigint,
	OUT drains bigint,
	OUT created_at timestamptz,
	OUT last_refill_at timestamptz)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'ratebucket_reserves'
LANGUAGE C VOLATILE PARALLEL RESTRICTED ROWS 10;

COMMENT ON FUNCTION ratebucket.bucket_reserves() IS
'The token reserves of this database''s endpoints now: tokens ready to draw, pending (moved by refills not yet committed), drawn (by takes not yet committed), the batch and limits they were filled under, committed draws and refills since the reserve was made, and how often feedback or a change emptied it.';

REVOKE ALL ON FUNCTION
	ratebucket.bucket_reserve(text, int),
	ratebucket.bucket_reserves()
	FROM PUBLIC;
