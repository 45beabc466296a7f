/*-------------------------------------------------------------------------
 *
 * feedback.c
 *	  The feedback policy: the settings in force for a bucket, and what a
 *	  destination's answer does to the bucket (bucket_observe's decision),
 *	  as pure functions of the row's state, the answer and the clock.
 *
 * The outcome table (doc/feedback.md):
 *	  2xx						success: ends a run of failures, closes a
 *								half-open breaker
 *	  429						throttled: a cooldown (Retry-After, else a
 *								rate-limit reset, else the default) and the
 *								effective rate times throttle_factor, never
 *								below the floor; a 429 to the first request
 *								after a throttle episode's cooldown is a
 *								lock-out: the cooldown grows, the rate stays
 *	  503 with Retry-After		unavailable: a cooldown
 *	  5xx, 408, 0 or NULL		failure: counts toward the breaker
 *	  anything else				neutral: the request's own fault
 * Whatever the status, rate-limit headers apply: remaining 0 means a
 * cooldown until the reset, and a published limit below the rate lowers the
 * effective rate.  A malformed header is the destination's fault, not the
 * caller's: it is counted and ignored (a 429 then gets the default
 * cooldown).
 * A calendar quota takes cooldowns, pauses and the breaker (they refuse
 * its takes without spending its quota), but no rate adaptation: it has no
 * rate, and its count is the provider's own.
 *
 *-------------------------------------------------------------------------
 */
#include <math.h>

#include "core/feedback.h"

/* The climb above a return level takes at least this many requests' time. */
#define RB_PROBE_REQUESTS 1200.0

/*
 * A lock-out (rb_locked_out): the first requests after a cooldown are those
 * sent within RB_LOCKOUT_TOKENS tokens' time at the effective rate of the
 * moment, or RB_LOCKOUT_FIRST_USECS if that is longer (the time from a
 * grant to its request's send); the cooldown doubles up to
 * RB_LOCKOUT_MAX_USECS (and never past ratebucket.max_cooldown).
 */
#define RB_LOCKOUT_TOKENS 2.0
#define RB_LOCKOUT_FIRST_USECS INT64_C(100000)
#define RB_LOCKOUT_MAX_USECS INT64_C(60000000)

/*
 * rb_policy_resolve
 *		The policy in force for a bucket whose ceiling (the rate its takes
 *		use) is "ceiling": the settings, overridden by the bucket's own
 *		configuration, with times in microseconds and the bounds made
 *		consistent (a minimum above the maximum is the maximum).
 */
void
rb_policy_resolve(const RbSettings *settings, const RbOverrides *overrides,
				  double ceiling, RbPolicy *policy)
{
	policy->throttle_factor = isnan(overrides->throttle_factor) ?
		settings->throttle_factor : overrides->throttle_factor;
	if (isnan(overrides->floor_rate))
		policy->floor_factor = settings->floor_fraction;
	else
	{
		double		f = overrides->floor_rate / ceiling;

		policy->floor_factor = 1.0 < f ? 1.0 : f;
	}
	policy->return_fraction = settings->return_fraction;
	policy->return_time = settings->return_time_ms / 1000.0;
	policy->recovery_factor = isnan(overrides->recovery_factor) ?
		settings->recovery_factor : overrides->recovery_factor;
	policy->recovery_interval = settings->recovery_interval_s;
	/*
	 * At least the time RB_PROBE_REQUESTS requests take at the ceiling: a
	 * climb that crosses a limit costs a 429 or a few, so that it costs a
	 * slow endpoint no larger a share of its requests than a fast one.
	 */
	if (ceiling > 0.0 && RB_PROBE_REQUESTS / ceiling > policy->recovery_interval)
		policy->recovery_interval = RB_PROBE_REQUESTS / ceiling;
	policy->default_cooldown = (int64_t) settings->default_cooldown_ms * 1000;
	policy->min_cooldown = (int64_t) settings->min_cooldown_ms * 1000;
	policy->max_cooldown = (int64_t) settings->max_cooldown_ms * 1000;
	if (policy->min_cooldown > policy->max_cooldown)
		policy->min_cooldown = policy->max_cooldown;
	policy->breaker_failures = overrides->breaker_failures >= 0 ?
		overrides->breaker_failures : settings->breaker_failures;
	policy->breaker_open = (int64_t) settings->breaker_open_ms * 1000;
	policy->breaker_max_open = (int64_t) settings->breaker_max_open_ms * 1000;
	if (policy->breaker_max_open < policy->breaker_open)
		policy->breaker_max_open = policy->breaker_open;
}

/*
 * rb_read_response
 *		Parse the rate-limit fields and Retry-After of a response received
 *		at now_unix (Unix seconds).  *rl is what rb_parse_rate_limit made of
 *		the fields; *ra_kind and *ra_value what rb_parse_retry_after_at made
 *		of Retry-After (the delay in seconds, or the Unix time of the date).
 *		rl->malformed counts every field given that could not be used: those
 *		the parsers refused, values that were not text, and a malformed
 *		Retry-After.
 */
void
rb_read_response(const RbResponse *response, double now_unix,
				 RbRateLimit *rl, RbRetryAfterKind *ra_kind, double *ra_value)
{
	rb_parse_rate_limit(response->ratelimit, response->ratelimit_len,
						response->policy, response->policy_len,
						response->limit, response->limit_len,
						response->remaining, response->remaining_len,
						response->reset, response->reset_len,
						now_unix, rl);
	rl->malformed += response->bad_fields;

	*ra_kind = RB_RA_ABSENT;
	*ra_value = 0.0;
	if (response->retry_after_bad)
		*ra_kind = RB_RA_MALFORMED;
	else if (response->retry_after != NULL)
		*ra_kind = rb_parse_retry_after_at(response->retry_after,
										   response->retry_after_len,
										   now_unix, ra_value);
	if (*ra_kind == RB_RA_MALFORMED)
		rl->malformed++;
}

/*
 * Seconds until the retry time a Retry-After value names, or NaN when it
 * names none.  A date is measured from now_unix (it may be in the past).
 */
static double
rb_retry_after_seconds(RbRetryAfterKind kind, double value, double now_unix)
{
	switch (kind)
	{
		case RB_RA_DELAY:
			return value;
		case RB_RA_DATE:
			return value - now_unix;
		case RB_RA_ABSENT:
		case RB_RA_MALFORMED:
			break;
	}
	return NAN;
}

/*
 * rb_response_outcome
 *		What a response means (rb_classify), its Retry-After read at
 *		now_unix: for an endpoint that has no bucket to adapt.
 */
RbOutcome
rb_response_outcome(const RbResponse *response, double now_unix)
{
	RbRateLimit rl;
	RbRetryAfterKind ra_kind;
	double		ra_value;

	rb_read_response(response, now_unix, &rl, &ra_kind, &ra_value);
	return rb_classify(response->status, response->has_status,
					   !isnan(rb_retry_after_seconds(ra_kind, ra_value,
													 now_unix)));
}

/*
 * The cooldown an answer asks for, in seconds (NaN: the default), or false
 * if it asks for none: a 429 or a 503 always cools down (Retry-After, else
 * the reset of a spent window, else the default); any other answer only
 * when its rate-limit fields say the window is spent until a reset.
 */
static bool
rb_cooldown_asked(RbOutcome outcome, double ra_seconds, const RbRateLimit *rl,
				  double *seconds)
{
	*seconds = NAN;
	if (outcome == RB_OUTCOME_THROTTLED || outcome == RB_OUTCOME_UNAVAILABLE)
	{
		*seconds = ra_seconds;
		if (isnan(*seconds) && rl->has_reset &&
			(!rl->has_remaining || rl->remaining <= 0))
			*seconds = rl->reset_seconds;
		return true;
	}
	if (rl->has_remaining && rl->remaining <= 0 && rl->has_reset)
	{
		*seconds = rl->reset_seconds;
		return true;
	}
	return false;
}

/*
 * A cooldown from "now" until "until".  A rate bucket empties
 * (rb_cool_down); a calendar quota keeps what is left of its window: the
 * cooldown refuses its takes until it ends (rb_quota_take) without
 * spending the quota.  A cooldown that lengthens the one in force starts
 * now (cooldown_from: a lock-out doubles it from there).
 */
static void
rb_apply_cooldown(RbState *state, RbAdapt *adapt, bool is_quota,
				  int64_t now, int64_t until)
{
	int64_t		was = adapt->cooldown_until;

	if (!is_quota)
		rb_cool_down(state, adapt, until);
	else if (adapt->cooldown_until == RB_NO_TIME ||
			 adapt->cooldown_until < until)
		adapt->cooldown_until = until;
	if (adapt->cooldown_until != was)
		adapt->cooldown_from = now;
}

/*
 * Is a 429 a lock-out: the destination refusing the first requests that
 * follow a throttle episode's cooldown, before the rate they were sent at
 * could matter?  A destination that refills as it goes (a token bucket)
 * took some requests back during the cooldown; one that counts requests in
 * a window, the refused ones included, or that holds a penalty, did not:
 * its window is still full, and a lower rate would not have helped.  So:
 * the request was sent after the cooldown of the last episode had ended
 * (the cooldown that set where the rate returns from, factor_at), within
 * the time of its first RB_LOCKOUT_TOKENS tokens at the rate of the moment
 * (or RB_LOCKOUT_FIRST_USECS), and nothing but 429s was heard since that
 * cooldown ended.  Without a send time, the answer's own time stands for it.
 */
static bool
rb_locked_out(const RbAdapt *before, const RbFeedbackCounters *counters,
			  const RbPolicy *policy, double ceiling, int64_t sent)
{
	int64_t		ended = before->cooldown_until;
	double		rate;
	double		first;

	if (ended == RB_NO_TIME || before->factor_at != ended || sent < ended)
		return false;
	if (counters->last_observed_at != RB_NO_TIME &&
		counters->last_observed_at >= ended && counters->last_status != 429)
		return false;
	rate = ceiling * rb_factor_now(before, policy, sent);
	first = rate > 0.0 ? RB_LOCKOUT_TOKENS / rate * RB_USECS_PER_SEC : 0.0;
	if (first < (double) RB_LOCKOUT_FIRST_USECS)
		first = (double) RB_LOCKOUT_FIRST_USECS;
	return (double) sent - (double) ended <= first;
}

/*
 * The cooldown of a lock-out, in microseconds: what the answer asked for
 * (asked, seconds) if it said, else twice the cooldown that just ended (or
 * than the default, if that is not known), at most RB_LOCKOUT_MAX_USECS.
 */
static int64_t
rb_lockout_cooldown(const RbAdapt *before, const RbPolicy *policy,
					double asked)
{
	double		last = (double) policy->default_cooldown;
	double		longest = (double) RB_LOCKOUT_MAX_USECS;

	if (!isnan(asked))
		return rb_clamp_cooldown(policy, asked);
	if (before->cooldown_from != RB_NO_TIME &&
		before->cooldown_from < before->cooldown_until)
		last = (double) before->cooldown_until - (double) before->cooldown_from;
	if (longest > (double) policy->max_cooldown)
		longest = (double) policy->max_cooldown;
	if (2.0 * last < longest)
		longest = 2.0 * last;
	return rb_clamp_cooldown(policy, longest / RB_USECS_PER_SEC);
}

/*
 * Is a 429 the first of a new throttle episode?  With the request's send
 * time: if it was sent once the last episode's cooldown was over (takes
 * were refused until then, so anything sent earlier was paced by the rate
 * that episode already corrected).  Without it: if no cooldown is running
 * as it is observed (one that is was started by an answer to the same
 * burst, sent before the destination's first complaint could slow anyone).
 */
static bool
rb_new_episode(const RbAdapt *before, int64_t sent, int64_t now)
{
	if (sent != RB_NO_TIME)
		return before->factor_at == RB_NO_TIME || sent >= before->factor_at;
	return before->cooldown_until == RB_NO_TIME || before->cooldown_until <= now;
}

/*
 * Hold no more than "remaining" tokens at "now", plus what the row refilled
 * since the request was sent (the destination answered at some point in
 * between, and refilled too since; without a send time, nothing).  The
 * row is refilled to "now" first at its own limits (bucket->refill_rate
 * and refill_capacity, those of the take that last wrote it), never at the
 * configured ones, which may be higher: the answer only caps.
 */
static void
rb_cap_tokens(RbState *state, const RbObserved *bucket, double remaining,
			  int64_t sent, int64_t now)
{
	double		most = remaining > 0 ? remaining : 0.0;

	rb_advance(state, bucket->refill_rate, bucket->refill_capacity, now);
	if (sent != RB_NO_TIME && sent < now)
		most += bucket->refill_rate *
			(((double) now - (double) sent) / RB_USECS_PER_SEC);
	if (state->tokens > most)
		state->tokens = most;
}

/* The counters an answer moves (but the breaker's and the cooldowns'). */
static void
rb_count_answer(RbFeedbackCounters *counters, RbOutcome outcome,
				int malformed, const RbResponse *response, int64_t now)
{
	if (outcome == RB_OUTCOME_SUCCESS)
		counters->successes++;
	else if (outcome == RB_OUTCOME_FAILURE)
		counters->failures++;
	if (malformed > 0)
		counters->malformed_headers += malformed;
	counters->last_status = response->has_status ? response->status : 0;
	counters->last_observed_at = now;
}

/*
 * The rate, on a 429: once per throttle episode.  A lock-out belongs to the
 * episode whose cooldown it follows: the rate holds where that episode put
 * it until the longer cooldown ends, then returns as it would have
 * (rb_lock_out).
 */
static void
rb_observe_throttle(RbAdapt *adapt, const RbPolicy *policy,
					const RbAdapt *before, bool is_quota, bool locked_out,
					int64_t sent, int64_t now, RbFeedbackCounters *counters)
{
	if (locked_out)
		rb_lock_out(adapt, policy, now);
	else if (!is_quota && rb_new_episode(before, sent, now))
		rb_throttle_episode(adapt, policy, sent != RB_NO_TIME ? sent : now, now);
	counters->throttles++;
}

/*
 * rb_feedback_observe
 *		Apply what a destination answered at "now" (now_unix: the same
 *		instant in Unix seconds, for HTTP-dates) to a bucket's state,
 *		adaptation and counters, under the policy in force; report what
 *		bucket_observe returns in *out.  See the file header for the table.
 */
void
rb_feedback_observe(RbState *state, RbAdapt *adapt,
					RbFeedbackCounters *counters, const RbPolicy *policy,
					const RbObserved *bucket, const RbResponse *response,
					int64_t now, double now_unix, RbObservation *out)
{
	RbAdapt		before = *adapt;
	RbRateLimit rl;
	RbRetryAfterKind ra_kind;
	double		ra_seconds;
	double		ra_value;
	double		cooldown;
	RbOutcome	outcome;
	bool		locked_out;
	int64_t		sent = response->sent_at;

	/* a send time after the answer (another clock): the answer's time */
	if (sent != RB_NO_TIME && sent > now)
		sent = now;

	rb_read_response(response, now_unix, &rl, &ra_kind, &ra_value);
	ra_seconds = rb_retry_after_seconds(ra_kind, ra_value, now_unix);
	outcome = rb_classify(response->status, response->has_status,
						  !isnan(ra_seconds));

	/*
	 * What the destination published of its limit bounds the rate and the
	 * burst (a quota has no rate: its count is the provider's own).
	 */
	if (rl.has_limit && rl.has_window && rl.window_seconds > 0 &&
		!bucket->is_quota)
		rb_publish_limit(adapt, rl.limit / rl.window_seconds / bucket->ceiling,
						 rl.limit / bucket->capacity);

	locked_out = outcome == RB_OUTCOME_THROTTLED && !bucket->is_quota &&
		rb_locked_out(&before, counters, policy, bucket->ceiling,
					  sent != RB_NO_TIME ? sent : now);
	if (rb_cooldown_asked(outcome, ra_seconds, &rl, &cooldown))
	{
		rb_apply_cooldown(state, adapt, bucket->is_quota, now,
						  now + (locked_out ?
								 rb_lockout_cooldown(&before, policy, cooldown) :
								 rb_clamp_cooldown(policy, cooldown)));
		if (adapt->cooldown_until != before.cooldown_until)
			counters->cooldowns++;
	}

	if (outcome == RB_OUTCOME_THROTTLED)
		rb_observe_throttle(adapt, policy, &before, bucket->is_quota,
							locked_out, sent, now, counters);

	/*
	 * What the destination says is left of its window: never hold more
	 * (held tokens would be refused there).
	 */
	if (rl.has_remaining && !bucket->is_quota && bucket->holds_tokens)
		rb_cap_tokens(state, bucket, rl.remaining,
					  response->sent_at == RB_NO_TIME ? RB_NO_TIME : sent, now);

	/* The breaker. */
	rb_breaker_observe(adapt, policy, outcome, now);
	if (adapt->open_until != before.open_until &&
		rb_breaker_state(adapt, now) == RB_BREAKER_OPEN)
		counters->breaker_opens++;

	rb_count_answer(counters, outcome, rl.malformed, response, now);

	out->outcome = outcome;
	out->cooldown_seconds = adapt->cooldown_until != RB_NO_TIME &&
		adapt->cooldown_until > now ?
		((double) adapt->cooldown_until - (double) now) / RB_USECS_PER_SEC : 0.0;
	out->effective_rate = bucket->ceiling * rb_factor_now(adapt, policy, now);
	out->breaker = rb_breaker_state(adapt, now);
	out->adapt_changed = rb_adapt_changed(&before, adapt, policy, now);
}

/*
 * rb_adapt_changed
 *		Did the adaptation state change what a take is told (a cooldown, a
 *		pause, the breaker, the effective rate)?  Only then must a change
 *		reach a striped endpoint's stripes.
 */
bool
rb_adapt_changed(const RbAdapt *before, const RbAdapt *after,
				 const RbPolicy *policy, int64_t now)
{
	double		f0 = rb_factor_now(before, policy, now);
	double		f1 = rb_factor_now(after, policy, now);

	double		c0 = rb_burst_fraction(before, policy, now);
	double		c1 = rb_burst_fraction(after, policy, now);

	return before->cooldown_until != after->cooldown_until ||
		fabs(c0 - c1) > 1e-12 ||
		before->paused_until != after->paused_until ||
		before->open_until != after->open_until ||
		before->breaker_trips != after->breaker_trips ||
		fabs(f0 - f1) > 1e-12 * (f0 > f1 ? f0 : f1);
}
