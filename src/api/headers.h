/*-------------------------------------------------------------------------
 *
 * headers.h
 *	  Response headers given as a jsonb object, read into the fields the
 *	  core's parsers take (headers.c), and PostgreSQL times in Unix seconds.
 *
 *-------------------------------------------------------------------------
 */
#ifndef RATEBUCKET_API_HEADERS_H
#define RATEBUCKET_API_HEADERS_H

#include "postgres.h"

#include "datatype/timestamp.h"
#include "utils/jsonb.h"

#include "core/feedback.h"

/* Unix seconds of a finite TimestampTz. */
extern double rb_unix_from_timestamptz(TimestampTz ts);

/* Seconds from "at" to the Unix time unix_seconds (negative if before). */
extern double rb_seconds_until(double unix_seconds, TimestampTz at);

extern void rb_response_from_jsonb(Jsonb *headers, RbResponse *response);

#endif							/* RATEBUCKET_API_HEADERS_H */
