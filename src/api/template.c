/*-------------------------------------------------------------------------
 *
 * template.c
 *	  SQL-callable templates: bucket_template, bucket_template_drop,
 *	  bucket_template_for, and the trigger that tells every backend the
 *	  templates changed.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "commands/trigger.h"
#include "fmgr.h"
#include "utils/builtins.h"

#include "api/args.h"
#include "bucket/template.h"
#include "engine/engine.h"

PG_FUNCTION_INFO_V1(ratebucket_template);
PG_FUNCTION_INFO_V1(ratebucket_template_drop);
PG_FUNCTION_INFO_V1(ratebucket_template_for);
PG_FUNCTION_INFO_V1(ratebucket_templates_changed);

/* The pattern argument, checked. */
static void
rb_arg_pattern(FunctionCallInfo fcinfo, int argno, RbTemplate *tmpl)
{
	char	   *pattern;

	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("pattern must not be null")));
	pattern = text_to_cstring(PG_GETARG_TEXT_PP(argno));
	memset(tmpl, 0, sizeof(*tmpl));
	tmpl->prefix_len = rb_template_check_pattern(pattern);
	strlcpy(tmpl->pattern, pattern, RB_TEXT_LEN);
}

/*
 * bucket_template(pattern text, rate float8, capacity float8,
 *				   floor_rate float8, throttle_factor float8,
 *				   recovery_factor float8, breaker_failures int)
 *		returns bigint
 *		Create or replace the template of a pattern, with bucket_configure's
 *		arguments, and configure the endpoints it now decides: returns how
 *		many (rb_engine_template_set).
 */
Datum
ratebucket_template(PG_FUNCTION_ARGS)
{
	RbTemplate	tmpl;
	bool		created;

	rb_arg_pattern(fcinfo, 0, &tmpl);
	rb_arg_config(fcinfo, 1, &tmpl.config);
	PG_RETURN_INT64(rb_engine_template_set(&tmpl, &created));
}

/*
 * bucket_template_drop(pattern text) returns boolean
 *		Drop a template; its endpoints move to the next that matches them,
 *		or keep their configuration.  False if there was no such template.
 */
Datum
ratebucket_template_drop(PG_FUNCTION_ARGS)
{
	RbTemplate	tmpl;

	rb_arg_pattern(fcinfo, 0, &tmpl);
	PG_RETURN_BOOL(rb_engine_template_drop(tmpl.pattern));
}

/*
 * bucket_template_for(endpoint text) returns text
 *		The pattern of the template that configures the endpoint when it has
 *		no configuration of its own; NULL if none matches.
 */
Datum
ratebucket_template_for(PG_FUNCTION_ARGS)
{
	text	   *endpoint = rb_arg_endpoint(fcinfo, 0);
	RbTemplate	tmpl;

	if (!rb_engine_template_for(endpoint, &tmpl))
		PG_RETURN_NULL();
	PG_RETURN_TEXT_P(cstring_to_text(tmpl.pattern));
}

/*
 * bucket_templates_changed() returns trigger
 *		The statement trigger of ratebucket.bucket_templates: every backend
 *		reads the templates again (bucket/template.c).
 */
Datum
ratebucket_templates_changed(PG_FUNCTION_ARGS)
{
	if (!CALLED_AS_TRIGGER(fcinfo))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("bucket_templates_changed must be called as a trigger")));
	rb_template_invalidate();
	return PointerGetDatum(NULL);
}
