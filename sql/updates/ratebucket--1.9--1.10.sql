/* ratebucket--1.9--1.10.sql */

-- ratebucket 1.9 -> 1.10: bucket_observe_batch, the answers of a batch of
-- requests observed with one lock and one row write per endpoint.

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION ratebucket UPDATE TO '1.10'" to load this file. \quit

-- A batch's answers: each endpoint's bucket locked once (in byte order of
-- the endpoints, as every batch locks), its answers applied in the order
-- given, its row written once.
CREATE FUNCTION ratebucket.bucket_observe_batch(
	endpoints text[],
	statuses int[],
	retry_afters text[] DEFAULT NULL,
	headers jsonb[] DEFAULT NULL,
	sent_ats timestamptz[] DEFAULT NULL,
	OUT ord int,
	OUT outcome text,
	OUT cooldown_seconds float8,
	OUT effective_rate float8,
	OUT breaker text)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'ratebucket_observe_batch'
LANGUAGE C VOLATILE PARALLEL UNSAFE COST 100 ROWS 50;

COMMENT ON FUNCTION ratebucket.bucket_observe_batch(text[], int[], text[], jsonb[], timestamptz[]) IS
'bucket_observe for a batch: element i of each array is one answer (statuses[i] from endpoints[i]; the optional arrays NULL or as long, NULL where there is nothing to say). Each endpoint''s bucket is locked once, in byte order of the endpoints, its answers applied in the order given and its row written once. Every element is checked before anything is locked. One row per element, in the order given (ord from 1), as bucket_observe would report it.';

-- as every function but the pure ones: granted by an administrator (workers
-- get it with bucket_observe)
REVOKE ALL ON FUNCTION ratebucket.bucket_observe_batch(text[], int[], text[], jsonb[], timestamptz[]) FROM PUBLIC;
