/* ratebucket--1.8--1.9.sql */

-- ratebucket 1.8 -> 1.9: bucket_take and bucket_take_upto return the named
-- row types take_result and take_upto_result instead of OUT parameters:
-- the same columns, with the same names and types, cheaper to call in FROM.

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION ratebucket UPDATE TO '1.9'" to load this file. \quit

-- Not while a view, a rule, a SQL-standard function body or any other
-- stored expression calls one of the four functions (pg_depend records
-- such a call, as DROP FUNCTION would find it): the call stored there
-- keeps the result type it was parsed with, record, and a call that leaves
-- out a default argument or names its arguments would fail to plan once
-- the function returns the new type.  The update refuses before it changes
-- anything, and says what to do.  (As DROP FUNCTION's own check, it does
-- not keep out a view created by a transaction that commits meanwhile.)
DO $$
DECLARE
	callers text;
BEGIN
	SELECT string_agg(DISTINCT x.o, ', ' ORDER BY x.o)
	INTO callers
	FROM pg_catalog.pg_depend AS d
	LEFT JOIN pg_catalog.pg_rewrite AS r
	  ON d.classid = 'pg_catalog.pg_rewrite'::regclass AND r.oid = d.objid
	CROSS JOIN LATERAL (SELECT CASE
			-- a view's query is its _RETURN rule: name the view
			WHEN r.rulename = '_RETURN'
			THEN pg_catalog.pg_describe_object('pg_catalog.pg_class'::regclass, r.ev_class, 0)
			ELSE pg_catalog.pg_describe_object(d.classid, d.objid, d.objsubid)
		END) AS x(o)
	WHERE d.refclassid = 'pg_catalog.pg_proc'::regclass
	  AND d.refobjid IN ('ratebucket.bucket_take(text, float8, float8, float8)'::regprocedure,
						 'ratebucket.bucket_take(text, float8)'::regprocedure,
						 'ratebucket.bucket_take_upto(text, float8, float8, int)'::regprocedure,
						 'ratebucket.bucket_take_upto(text, int)'::regprocedure)
	  AND d.deptype = 'n';
	IF callers IS NOT NULL THEN
		RAISE EXCEPTION 'cannot update ratebucket to 1.9 while other objects call bucket_take or bucket_take_upto'
			USING ERRCODE = 'dependent_objects_still_exist',
				  DETAIL = 'Calling them: ' || callers || '. Version 1.9 declares their result as the row types take_result and take_upto_result (the same columns); a call stored before the update is typed record.',
				  HINT = 'Drop those objects, run the update, then create them again.';
	END IF;
END;
$$;

CREATE TYPE ratebucket.take_result AS (
	allowed boolean,
	remaining float8,
	wait_seconds float8
);

COMMENT ON TYPE ratebucket.take_result IS
'What bucket_take returns: allowed, the tokens remaining, and the seconds to wait before tokens would be available (0 when allowed).';

CREATE TYPE ratebucket.take_upto_result AS (
	granted int,
	remaining float8,
	wait_seconds float8
);

COMMENT ON TYPE ratebucket.take_upto_result IS
'What bucket_take_upto returns: the tokens granted (0 when refused), the tokens remaining, and the seconds until the next token could be granted (0 when all were).';

-- The four functions are changed where they stand, in pg_proc.  CREATE OR
-- REPLACE cannot change a function's result type, and DROP and CREATE would
-- take with the function what hangs on its OID: the EXECUTE its users were
-- granted, its initial privileges (pg_init_privs, which pg_dump compares
-- them with), and Citus's record of a distributed function.  The row is made
-- what CREATE FUNCTION makes of the new definition: the type as its result,
-- no OUT parameters (every argument is IN, so pg_proc keeps neither the
-- argument modes nor all their types), the names of the IN arguments only,
-- and the dependency on the result type that CREATE FUNCTION records (a
-- built-in type such as record has none).  Updating pg_proc sends the
-- invalidations that make every session, and every cached plan, see the new
-- definition.
WITH changed(fn, result, argnames) AS (
	VALUES
	('ratebucket.bucket_take(text, float8, float8, float8)'::regprocedure,
	 'ratebucket.take_result'::regtype, '{endpoint,rate,capacity,tokens}'::text[]),
	('ratebucket.bucket_take(text, float8)'::regprocedure,
	 'ratebucket.take_result'::regtype, '{endpoint,tokens}'::text[]),
	('ratebucket.bucket_take_upto(text, float8, float8, int)'::regprocedure,
	 'ratebucket.take_upto_result'::regtype, '{endpoint,rate,capacity,max_tokens}'::text[]),
	('ratebucket.bucket_take_upto(text, int)'::regprocedure,
	 'ratebucket.take_upto_result'::regtype, '{endpoint,max_tokens}'::text[])
), updated AS (
	UPDATE pg_catalog.pg_proc AS p
	SET prorettype = c.result,
		proallargtypes = NULL,
		proargmodes = NULL,
		proargnames = c.argnames
	FROM changed AS c
	WHERE p.oid = c.fn
	  AND p.prorettype = 'pg_catalog.record'::regtype
	RETURNING p.oid, p.prorettype
)
INSERT INTO pg_catalog.pg_depend
	(classid, objid, objsubid, refclassid, refobjid, refobjsubid, deptype)
SELECT 'pg_catalog.pg_proc'::regclass, u.oid, 0, 'pg_catalog.pg_type'::regclass, u.prorettype, 0, 'n'
FROM updated AS u;

-- All four, or the update stops here (and its transaction rolls back).
DO $$
BEGIN
	IF (SELECT count(*) FROM pg_catalog.pg_proc
		WHERE oid IN ('ratebucket.bucket_take(text, float8, float8, float8)'::regprocedure,
					  'ratebucket.bucket_take(text, float8)'::regprocedure,
					  'ratebucket.bucket_take_upto(text, float8, float8, int)'::regprocedure,
					  'ratebucket.bucket_take_upto(text, int)'::regprocedure)
		  AND prorettype IN ('ratebucket.take_result'::regtype,
							 'ratebucket.take_upto_result'::regtype)
		  AND proallargtypes IS NULL) <> 4
	THEN
		RAISE EXCEPTION 'ratebucket 1.9: bucket_take and bucket_take_upto are not as 1.8 defines them'
			USING ERRCODE = 'object_not_in_prerequisite_state';
	END IF;
END;
$$;
