-- The snapshot of an extension's objects the upgrade tests compare
-- (sql/upgrade.sql, sql/queue_upgrade.sql), included with \i.
--
-- pg_temp.ext_objects(name): a snapshot of every object that belongs to an
-- extension (pg_depend deptype 'e'), as (object, property, value) rows,
-- free of OIDs and of the name of the installing role: functions with
-- their signature, result, volatility, parallel safety, strictness, cost,
-- SECURITY DEFINER, settings, source or C symbol, privileges (current and
-- initial, as pg_dump sees them), dependencies and comment; the composite
-- types' columns; the tables' and the views' columns (position, type, NOT
-- NULL, default, comment, privileges), options, indexes, constraints,
-- triggers, privileges and comment; the views' definitions; and the
-- extension's own schema, configuration tables and their conditions.
--

-- A privilege list as text, "grantee=privileges/grantor" (* for WITH GRANT
-- OPTION), the object's owner written "owner" (its name is whoever runs the
-- tests) and PUBLIC "PUBLIC".  MAINTAIN (PostgreSQL 17 and later), which
-- an owner holds by default and no test grants, is left out, so that a list
-- reads the same on every version.
CREATE FUNCTION pg_temp.acl(acl aclitem[], owner oid) RETURNS text
LANGUAGE sql STABLE AS $$
	SELECT coalesce(string_agg(item, ' ' ORDER BY item COLLATE "C"), '(none)')
	FROM (SELECT format('%s=%s/%s', grantee,
						string_agg(privilege, ',' ORDER BY privilege COLLATE "C"), grantor) AS item
		  FROM (SELECT CASE a.grantee WHEN 0 THEN 'PUBLIC' WHEN owner THEN 'owner'
							ELSE a.grantee::regrole::text END AS grantee,
					   CASE a.grantor WHEN owner THEN 'owner'
							ELSE a.grantor::regrole::text END AS grantor,
					   a.privilege_type ||
					   CASE WHEN a.is_grantable THEN '*' ELSE '' END AS privilege
				FROM aclexplode(acl) AS a
				WHERE a.privilege_type <> 'MAINTAIN') AS p
		  GROUP BY grantee, grantor) AS items
$$;

CREATE FUNCTION pg_temp.ext_objects(ext_name name)
RETURNS TABLE (object text, property text, value text)
LANGUAGE sql STABLE AS $$
	WITH ext AS (
		SELECT e.oid, e.extowner, e.extnamespace, e.extrelocatable,
			   e.extconfig, e.extcondition
		FROM pg_extension e WHERE e.extname = ext_name
	), member AS (
		SELECT d.classid, d.objid
		FROM pg_depend d, ext
		WHERE d.refclassid = 'pg_extension'::regclass AND d.refobjid = ext.oid
		  AND d.deptype = 'e'
		  -- Not the row type of a table or a view, nor an array type:
		  -- PostgreSQL 18 records them as members too, earlier versions not.
		  AND NOT EXISTS (SELECT FROM pg_type t LEFT JOIN pg_class c ON c.oid = t.typrelid
						  WHERE d.classid = 'pg_type'::regclass AND t.oid = d.objid
							AND (c.relkind <> 'c'
								 OR EXISTS (SELECT FROM pg_type e WHERE e.typarray = t.oid)))
	), initacl AS (
		SELECT i.classoid, i.objoid, i.objsubid, i.initprivs
		FROM pg_init_privs i WHERE i.privtype = 'e'
	), rel AS (
		SELECT c.*, pg_describe_object('pg_class'::regclass, c.oid, 0) AS object
		FROM pg_class c JOIN member m
		  ON m.classid = 'pg_class'::regclass AND m.objid = c.oid
	), col AS (
		SELECT a.*, r.relowner,
			   pg_describe_object('pg_class'::regclass, a.attrelid, a.attnum) AS object,
			   row_number() OVER (PARTITION BY a.attrelid ORDER BY a.attnum) AS position
		FROM pg_attribute a JOIN rel r ON r.oid = a.attrelid
		WHERE a.attnum > 0 AND NOT a.attisdropped
	)
	-- The extension itself.
	SELECT 'extension ' || ext_name, p.property, coalesce(p.value, '(null)')
	FROM ext, LATERAL (VALUES
		('schema', ext.extnamespace::regnamespace::text),
		('relocatable', ext.extrelocatable::text),
		('config tables', ext.extconfig::regclass[]::text),
		('config conditions', ext.extcondition::text)) AS p(property, value)
	UNION ALL
	-- Every member, and its comment.
	SELECT pg_describe_object(m.classid, m.objid, 0), p.property,
		   coalesce(p.value, '(null)')
	FROM member m, LATERAL (VALUES
		('member', 'yes'),
		('comment', obj_description(m.objid, m.classid::regclass::name))) AS p(property, value)
	UNION ALL
	-- Functions.
	SELECT pg_describe_object('pg_proc'::regclass, f.oid, 0), p.property,
		   coalesce(p.value, '(null)')
	FROM pg_proc f
	JOIN member m ON m.classid = 'pg_proc'::regclass AND m.objid = f.oid
	CROSS JOIN ext
	JOIN pg_language l ON l.oid = f.prolang
	LEFT JOIN initacl i ON i.classoid = 'pg_proc'::regclass AND i.objoid = f.oid
	CROSS JOIN LATERAL (VALUES
		('kind', f.prokind::text),
		('arguments', pg_get_function_arguments(f.oid)),
		('result', pg_get_function_result(f.oid)),
		('language', l.lanname::text),
		('volatility', f.provolatile::text),
		('parallel', f.proparallel::text),
		('strict', f.proisstrict::text),
		('security definer', f.prosecdef::text),
		('leakproof', f.proleakproof::text),
		('cost', f.procost::text),
		('rows', f.prorows::text),
		('config', f.proconfig::text),
		('source', f.prosrc),
		('library', f.probin),
		('owner', CASE WHEN f.proowner = ext.extowner THEN 'extension owner'
					   ELSE f.proowner::regrole::text END),
		('acl', pg_temp.acl(coalesce(f.proacl, acldefault('f', f.proowner)), f.proowner)),
		('initial acl', pg_temp.acl(i.initprivs, f.proowner)),
		-- What it depends on (types, a language), as CREATE FUNCTION
		-- records it: built-in objects are pinned and not listed.
		('depends on', (SELECT string_agg(x.o, ', ' ORDER BY x.o COLLATE "C")
						FROM pg_depend d,
							 LATERAL pg_describe_object(d.refclassid, d.refobjid,
														d.refobjsubid) AS x(o)
						WHERE d.classid = 'pg_proc'::regclass AND d.objid = f.oid
						  AND d.deptype = 'n'))) AS p(property, value)
	UNION ALL
	-- Composite types: their columns.
	SELECT pg_describe_object('pg_type'::regclass, t.oid, 0), 'columns',
		   (SELECT string_agg(format('%I %s', a.attname, format_type(a.atttypid, a.atttypmod)),
							  ', ' ORDER BY a.attnum)
			FROM pg_attribute a
			WHERE a.attrelid = t.typrelid AND a.attnum > 0 AND NOT a.attisdropped)
	FROM pg_type t
	JOIN member m ON m.classid = 'pg_type'::regclass AND m.objid = t.oid
	WHERE t.typtype = 'c'
	UNION ALL
	-- Tables, views and sequences.
	SELECT r.object, p.property, coalesce(p.value, '(null)')
	FROM rel r
	CROSS JOIN ext
	LEFT JOIN initacl i ON i.classoid = 'pg_class'::regclass AND i.objoid = r.oid
		AND i.objsubid = 0
	CROSS JOIN LATERAL (VALUES
		('kind', r.relkind::text),
		('persistence', r.relpersistence::text),
		('options', (SELECT string_agg(o, ', ' ORDER BY o) FROM unnest(r.reloptions) AS o)),
		('row security', r.relrowsecurity::text),
		('replica identity', r.relreplident::text),
		('view definition', CASE WHEN r.relkind = 'v' THEN pg_get_viewdef(r.oid, true) END),
		('owner', CASE WHEN r.relowner = ext.extowner THEN 'extension owner'
					   ELSE r.relowner::regrole::text END),
		('acl', pg_temp.acl(coalesce(r.relacl,
									 acldefault((CASE r.relkind WHEN 'S' THEN 's' ELSE 'r' END)::"char", r.relowner)),
							 r.relowner)),
		('initial acl', pg_temp.acl(i.initprivs, r.relowner))) AS p(property, value)
	UNION ALL
	-- Their columns.
	SELECT c.object, p.property, coalesce(p.value, '(null)')
	FROM col c
	LEFT JOIN pg_attrdef ad ON ad.adrelid = c.attrelid AND ad.adnum = c.attnum
	CROSS JOIN LATERAL (VALUES
		('position', c.position::text),
		('type', format_type(c.atttypid, c.atttypmod)),
		('not null', c.attnotnull::text),
		('default', pg_get_expr(ad.adbin, ad.adrelid)),
		('comment', col_description(c.attrelid, c.attnum)),
		('acl', pg_temp.acl(c.attacl, c.relowner))) AS p(property, value)
	UNION ALL
	-- Indexes, constraints and triggers on the table.
	SELECT pg_describe_object('pg_class'::regclass, x.indexrelid, 0), 'definition',
		   pg_get_indexdef(x.indexrelid)
	FROM pg_index x JOIN rel r ON r.oid = x.indrelid
	UNION ALL
	SELECT pg_describe_object('pg_constraint'::regclass, k.oid, 0), 'definition',
		   pg_get_constraintdef(k.oid)
	FROM pg_constraint k JOIN rel r ON r.oid = k.conrelid
	-- Not the NOT NULL constraints PostgreSQL 18 records (contype 'n'): the
	-- columns' NOT NULL, above, says the same on every version.
	WHERE k.contype <> 'n'
	UNION ALL
	SELECT pg_describe_object('pg_trigger'::regclass, t.oid, 0), 'definition',
		   pg_get_triggerdef(t.oid)
	FROM pg_trigger t JOIN rel r ON r.oid = t.tgrelid
	WHERE NOT t.tgisinternal
$$;
