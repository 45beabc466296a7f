/*-------------------------------------------------------------------------
 *
 * headers_sql.h
 *	  The header parsers of headers.h, fed from a jsonb object of response
 *	  headers, for the SQL-callable functions and bucket_observe.
 *
 *-------------------------------------------------------------------------
 */
#ifndef RATEBUCKET_HEADERS_SQL_H
#define RATEBUCKET_HEADERS_SQL_H

#include "postgres.h"

#include "datatype/timestamp.h"
#include "utils/jsonb.h"

#include "headers.h"

/* Unix seconds of a finite TimestampTz. */
extern double rb_unix_from_timestamptz(TimestampTz ts);

/* Seconds from "at" to the Unix time unix_seconds (negative if before). */
extern double rb_seconds_until(double unix_seconds, TimestampTz at);

/*
 * Parse the rate-limit fields and Retry-After found in a jsonb object of
 * header name -> value, received at now_unix.  Raises 22023 if headers is
 * not an object; headers NULL is an empty object.  rl->malformed counts
 * every field that could not be used, a malformed Retry-After included.
 */
extern void rb_headers_from_jsonb(Jsonb *headers, double now_unix,
								  RbRateLimit *rl, RbRetryAfterKind *ra_kind,
								  double *ra_value);

#endif							/* RATEBUCKET_HEADERS_SQL_H */
