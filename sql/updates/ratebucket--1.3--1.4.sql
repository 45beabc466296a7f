/* ratebucket--1.3--1.4.sql */

-- ratebucket 1.3 -> 1.4: the in-flight caps' functions in C.
--
-- inflight_configure, inflight_acquire, inflight_release, inflight_renew and
-- inflight_drop keep their signatures, defaults, privileges, comments and
-- behaviour; their bodies move from PL/pgSQL to the library
-- (src/bucket/inflight.c), where bucket_take_batch acquires its slots too.

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION ratebucket UPDATE TO '1.4'" to load this file. \quit

CREATE OR REPLACE FUNCTION ratebucket.inflight_configure(
	key text,
	cap int,
	lease interval DEFAULT '5 minutes')
RETURNS void
AS 'MODULE_PATHNAME', 'ratebucket_inflight_configure'
LANGUAGE C VOLATILE PARALLEL UNSAFE COST 100
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

CREATE OR REPLACE FUNCTION ratebucket.inflight_acquire(key text, n int DEFAULT 1)
RETURNS bigint[]
AS 'MODULE_PATHNAME', 'ratebucket_inflight_acquire'
LANGUAGE C VOLATILE PARALLEL UNSAFE COST 100
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

CREATE OR REPLACE FUNCTION ratebucket.inflight_release(key text, slots bigint[])
RETURNS int
AS 'MODULE_PATHNAME', 'ratebucket_inflight_release'
LANGUAGE C VOLATILE PARALLEL UNSAFE COST 100
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

CREATE OR REPLACE FUNCTION ratebucket.inflight_renew(key text, slots bigint[], lease interval DEFAULT NULL)
RETURNS int
AS 'MODULE_PATHNAME', 'ratebucket_inflight_renew'
LANGUAGE C VOLATILE PARALLEL UNSAFE COST 100
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

CREATE OR REPLACE FUNCTION ratebucket.inflight_drop(key text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'ratebucket_inflight_drop'
LANGUAGE C VOLATILE PARALLEL UNSAFE COST 100
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;
