/*-------------------------------------------------------------------------
 *
 * settings.c
 *	  The ratebucket.* settings.
 *
 * They are the defaults of the feedback policy; bucket_configure overrides
 * some per endpoint.  All are PGC_SUSET: only a superuser (or a role granted
 * SET on them) may change them, in a session or with ALTER SYSTEM / ALTER
 * DATABASE, so that no worker can loosen a limit for itself.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <limits.h>

#include "utils/guc.h"

#include "bucket/settings.h"

RbSettings	rb_settings = {
	.throttle_factor = 0.7,
	.floor_fraction = 0.1,
	.return_fraction = 0.85,
	.return_time_ms = 2000,
	.recovery_factor = 2.0,
	.recovery_interval_s = 20,
	.default_cooldown_ms = 1000,
	.min_cooldown_ms = 1000,
	.max_cooldown_ms = 3600 * 1000,
	.breaker_failures = 5,
	.breaker_open_ms = 30 * 1000,
	.breaker_max_open_ms = 600 * 1000,
};
bool		rb_direct_access = true;
bool		rb_events = false;

/* rb_settings_init: define the settings and reserve the prefix. */
void
rb_settings_init(void)
{
	DefineCustomRealVariable("ratebucket.throttle_factor",
							 "Multiplies an endpoint's effective rate, as it was when the request was sent, on the first 429 of a throttle episode.",
							 NULL, &rb_settings.throttle_factor, 0.7, 0.01, 1.0,
							 PGC_SUSET, 0, NULL, NULL, NULL);
	DefineCustomRealVariable("ratebucket.floor_fraction",
							 "Lowest effective rate, as a fraction of the configured rate, for endpoints without a floor of their own.",
							 NULL, &rb_settings.floor_fraction, 0.1, 0.0001, 1.0,
							 PGC_SUSET, 0, NULL, NULL, NULL);
	DefineCustomRealVariable("ratebucket.return_fraction",
							 "After a throttle episode, the effective rate returns to this fraction of the rate the throttled request was sent at.",
							 NULL, &rb_settings.return_fraction, 0.85, 0.01, 1.0,
							 PGC_SUSET, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("ratebucket.return_time",
							"Time the effective rate takes to return, along a concave curve, after a throttle episode's cooldown.",
							NULL, &rb_settings.return_time_ms, 2000, 1, 3600 * 1000,
							PGC_SUSET, GUC_UNIT_MS, NULL, NULL, NULL);
	DefineCustomRealVariable("ratebucket.recovery_factor",
							 "Growth of the effective rate above its return level per recovery interval, along a convex curve (1 disables it).",
							 NULL, &rb_settings.recovery_factor, 2.0, 1.0, 100.0,
							 PGC_SUSET, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("ratebucket.recovery_interval",
							"Time over which the effective rate grows by recovery_factor above its return level.",
							NULL, &rb_settings.recovery_interval_s, 20, 1, 86400,
							PGC_SUSET, GUC_UNIT_S, NULL, NULL, NULL);
	DefineCustomIntVariable("ratebucket.default_cooldown",
							"Cooldown after a 429 that carries no usable Retry-After or rate-limit reset.",
							NULL, &rb_settings.default_cooldown_ms, 1000, 0, 86400 * 1000,
							PGC_SUSET, GUC_UNIT_MS, NULL, NULL, NULL);
	DefineCustomIntVariable("ratebucket.min_cooldown",
							"Shortest cooldown, also for a Retry-After date in the past.",
							NULL, &rb_settings.min_cooldown_ms, 1000, 0, 86400 * 1000,
							PGC_SUSET, GUC_UNIT_MS, NULL, NULL, NULL);
	DefineCustomIntVariable("ratebucket.max_cooldown",
							"Longest cooldown a destination can impose; also caps the wait reported for a pause.",
							NULL, &rb_settings.max_cooldown_ms, 3600 * 1000, 1000, INT_MAX,
							PGC_SUSET, GUC_UNIT_MS, NULL, NULL, NULL);
	DefineCustomIntVariable("ratebucket.breaker_failures",
							"Consecutive failures that open an endpoint's circuit breaker (0 disables it).",
							NULL, &rb_settings.breaker_failures, 5, 0, 1000000,
							PGC_SUSET, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("ratebucket.breaker_open",
							"How long a circuit breaker first stays open; it doubles on each trip in a row.",
							NULL, &rb_settings.breaker_open_ms, 30 * 1000, 1, INT_MAX,
							PGC_SUSET, GUC_UNIT_MS, NULL, NULL, NULL);
	DefineCustomIntVariable("ratebucket.breaker_max_open",
							"Longest a circuit breaker stays open.",
							NULL, &rb_settings.breaker_max_open_ms, 600 * 1000, 1, INT_MAX,
							PGC_SUSET, GUC_UNIT_MS, NULL, NULL, NULL);

	DefineCustomBoolVariable("ratebucket.direct_access",
							 "Read and write bucket rows through the index and the heap directly, not through SQL.",
							 "Off: every row access runs as an SQL statement (SPI), "
							 "as it must where the table is distributed (Citus).",
							 &rb_direct_access, true,
							 PGC_SUSET, 0, NULL, NULL, NULL);

	DefineCustomBoolVariable("ratebucket.events",
							 "Send a NOTIFY on ratebucket_events when a breaker opens or closes, an endpoint reaches or leaves its floor, a quota is spent or reset, an endpoint is paused or resumed.",
							 "Every role that can connect may LISTEN, and hears every endpoint's events. PostgreSQL refuses to PREPARE TRANSACTION after a NOTIFY.",
							 &rb_events, false,
							 PGC_SUSET, 0, NULL, NULL, NULL);

#if PG_VERSION_NUM >= 150000
	MarkGUCPrefixReserved("ratebucket");
#else
	EmitWarningsOnPlaceholders("ratebucket");
#endif
}
