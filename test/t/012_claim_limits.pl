# 012_claim_limits.pl — claim_events (ratebucket_queue) honours every limit
# of its events: besides its endpoint, an event may name other buckets in
# "limits" (an account's rate, a calendar quota) and an in-flight cap in
# "inflight_key".  The claim filters on them before locking
# (bucket_grantable, the cap's free slots) and grants the batch in one
# bucket_take_batch.
#
# Each property gets a check that can fail:
#
#   Filtered before locking  an account with no token, shared by endpoints
#                            full of tokens: a claim returns none of their
#                            events and takes no token from the endpoints;
#                            when the account's next token is near, a second
#                            session locks all those events with SKIP LOCKED
#                            while the claim is still open, and they are
#                            untouched afterwards; when it is far, they are
#                            parked until it comes, attempts unchanged.
#   Shared account           two endpoints of 100 tokens each share an
#                            account holding 7: a claim of 80 gets exactly 7
#                            in all; the account granted 7, each endpoint as
#                            many as its events claimed; the next claim none.
#                            An account holding less than its endpoints ask
#                            goes to the endpoint of the best due event, not
#                            to the first name.
#   Calendar quota           a quota of 5 a day as a limit of two endpoints:
#                            5 events claimed over three claims, the other
#                            15 parked until the quota resets.
#   In-flight cap            a cap of 3 over three endpoints: a claim gets 3,
#                            the next 0 (no error, no token spent; with
#                            cap_wait => 0 nothing parked); an outcome frees a slot and the next
#                            claim gets 1; requeue_expired frees the slots of
#                            expired leases, events pending, attempts
#                            unchanged, and the next claim gets them again.
#                            An endpoint held back only by a full cap is
#                            parked for cap_wait, so 20 x batch of its due
#                            events do not hide the endpoints behind them.
#   Unconfigured limit       events whose limit is not configured, or whose
#                            cap does not exist, are left alone (not claimed,
#                            not parked, no token spent), and the claim still
#                            returns the other endpoints' events, no error.
#   Mixed limits on one      one endpoint, events with different limits: the
#   endpoint                 claim locks and parks only the events answering
#                            to the limits it checked (those of the
#                            endpoint's first due event): an unconfigured
#                            limit behind a claimable event does not fail
#                            the claim, and an empty account at the head
#                            does not park the events of another account.
#   Rollback                 a claim rolled back gives back every token of
#                            the endpoints and the account and every slot.
#   Many workers             8 pgbench clients for 5 s over 6 endpoints in
#                            two accounts, one account's events also under an
#                            in-flight cap of 5 that a recorder script frees
#                            (record_delivery), 1 in 5 claims rolled back:
#                            no event claimed twice; for every bucket, tokens
#                            granted within rate*T + capacity and equal to
#                            the logged claims that took from it; account A
#                            binds (>= 80% of what it offered, its endpoints
#                            together far below theirs); in flight never
#                            above 5 (counted in each claim's own
#                            transaction, which holds the cap's row: exact)
#                            and 5 reached; slots = events in flight at the
#                            end; no error, no deadlock.  (A's events are
#                            queued before B's, so that A's demand never
#                            waits on B's cap.)

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use lib 'test/perl';
use RatebucketTest;

my $node = start_node('claim_limits', conf => "max_connections = 40\n");
$node->safe_psql('postgres', 'CREATE EXTENSION ratebucket_queue');

# A rate so low that nothing refills while a check runs (a token in 11.6 days).
my $still = '0.000001';

sub sql { return $node->safe_psql('postgres', $_[0]); }

# Start each part from an empty queue, no buckets and no caps.
sub clean
{
	sql(q{TRUNCATE webhook_events, webhook_parking;
		  SELECT count(ratebucket.bucket_drop(endpoint)) FROM ratebucket.bucket_status;
		  SELECT count(ratebucket.inflight_drop(key)) FROM ratebucket.inflight_caps});
}

# The events of some endpoints as a string: what "untouched" compares.
sub events_of
{
	my ($where) = @_;
	return sql(qq{
SELECT string_agg(id || ':' || status || ':' || next_attempt_at || ':' || attempts
				  || ':' || coalesce(slot::text, '-'), ',' ORDER BY id)
FROM webhook_events WHERE $where});
}

# endpoint=takes_granted/tokens_granted of some buckets.
sub grants_of
{
	my (@keys) = @_;
	my $in = join ',', map { "'$_'" } @keys;
	return sql(qq{
SELECT string_agg(endpoint || '=' || takes_granted || '/' || tokens_granted, ' ' ORDER BY endpoint)
FROM ratebucket.bucket_status WHERE endpoint IN ($in)});
}

my $s1 = $node->background_psql('postgres');

# -------------------------------------------------- filtered before locking --

# f1, f2: full endpoints whose account "near" has no token, the next in 2 s
# (less than park_after, 10 s: not parked).  d1, d2: full endpoints whose
# account "dry" has none for 11 days (parked).  ok: no limits.
clean();
sql(qq{
SELECT ratebucket.bucket_configure(e, 1000, 1000) FROM unnest(ARRAY['f1', 'f2', 'd1', 'd2']) e;
SELECT ratebucket.bucket_configure('near', 0.5, 1);
SELECT ratebucket.bucket_take('near', 1);
SELECT ratebucket.bucket_configure('dry', $still, 3);
SELECT ratebucket.bucket_take('dry', 3);
SELECT ratebucket.bucket_configure('ok', $still, 5);
INSERT INTO webhook_events (endpoint, priority, limits)
SELECT e, 1, '{near}' FROM unnest(ARRAY['f1', 'f2']) e, generate_series(1, 10);
INSERT INTO webhook_events (endpoint, priority, limits)
SELECT e, 1, '{dry}' FROM unnest(ARRAY['d1', 'd2']) e, generate_series(1, 10);
INSERT INTO webhook_events (endpoint) SELECT 'ok' FROM generate_series(1, 20);
});
my $near_before = events_of(q{endpoint IN ('f1', 'f2')});

$s1->query_safe('BEGIN');
is($s1->query_safe(
		q{SELECT string_agg(DISTINCT endpoint, ',') || ' ' || count(*)
		  FROM claim_events(80, 10, park_after => 10)}),
	'ok 5',
	'a claim takes none of the events whose account has no token, only the others');
# While the claim's transaction is open: the events of the endpoints whose
# account is out of tokens were not locked; the 5 claimed are.
is(sql(q{SELECT count(*) FROM (SELECT id FROM webhook_events
		  WHERE endpoint IN ('f1', 'f2') FOR UPDATE SKIP LOCKED) x}),
	'20', 'the events of endpoints whose account has no token were not locked');
is(sql(q{SELECT count(*) FROM (SELECT id FROM webhook_events
		  WHERE endpoint = 'ok' FOR UPDATE SKIP LOCKED) x}),
	'15', 'the claimed events are locked by the claim (the check can see a lock)');
$s1->query_safe('COMMIT');
is(events_of(q{endpoint IN ('f1', 'f2')}), $near_before,
	'nor touched: same status, due time and attempts');
is(grants_of('f1', 'f2', 'd1', 'd2', 'near', 'dry'),
	'd1=0/0 d2=0/0 dry=1/3 f1=0/0 f2=0/0 near=1/1',
	'no token taken from the endpoints, nor from the accounts (their own setup takes)');
# The account out of tokens for 11 days: its endpoints' events were moved
# to when its next token comes, one token apart, attempts unchanged.
my ($parked, $first_off, $untried) = split /\|/, sql(q{
SELECT count(*) FILTER (WHERE status = 'pending' AND next_attempt_at > now() + interval '11 days'),
	   round(extract(epoch FROM min(next_attempt_at)
					 - (now() + make_interval(secs => ratebucket.bucket_wait('dry'))))::numeric, 1),
	   bool_and(attempts = 0)
FROM webhook_events WHERE endpoint IN ('d1', 'd2')});
is($parked, 20, "the events of endpoints whose account is empty for 11 days are parked (20 of 20)");
ok(abs($first_off) <= 1,
	"the first due when the account's next token comes (${first_off} s off)");
is($untried, 't', 'attempts unchanged');

# --------------------------------------------------------- shared account --

clean();
sql(qq{
SELECT ratebucket.bucket_configure('acct7', $still, 7);
SELECT ratebucket.bucket_configure(e, $still, 100) FROM unnest(ARRAY['s1', 's2']) e;
INSERT INTO webhook_events (endpoint, limits)
SELECT e, '{acct7}' FROM unnest(ARRAY['s1', 's2']) e, generate_series(1, 50);
CREATE TABLE got (id bigint, endpoint text);
});
is(sql(q{WITH c AS (SELECT * FROM claim_events(80, 40)), i AS (INSERT INTO got SELECT id, endpoint FROM c)
		 SELECT count(*) FROM c}),
	'7', 'two endpoints of 100 tokens sharing an account of 7: a claim of 80 gets 7 in all');
my $claimed_per = sql(q{SELECT string_agg(endpoint || '=' || n, ' ' ORDER BY endpoint)
						FROM (SELECT endpoint, count(*) AS n FROM got GROUP BY endpoint) x});
is(sql(q{SELECT string_agg(b.endpoint || '=' || b.tokens_granted, ' ' ORDER BY b.endpoint)
		 FROM ratebucket.bucket_status b
		 WHERE b.endpoint IN ('s1', 's2') AND b.tokens_granted > 0}),
	$claimed_per, "each endpoint granted as many tokens as its events claimed ($claimed_per)");
is(grants_of('acct7'), 'acct7=1/7', 'the account granted 7 tokens, in one take');
is(sql(q{SELECT count(*) FROM claim_events(80, 40)}), '0', 'the next claim gets none');
is(sql(q{SELECT count(*) FILTER (WHERE status = 'sending') || ' ' ||
				count(*) FILTER (WHERE status = 'pending' AND attempts = 0
								 AND next_attempt_at > now() + interval '11 days')
		 FROM webhook_events}),
	'7 93', 'the other 93 wait for the account\'s next token (in 11 days), attempts unchanged');
is(grants_of('acct7', 's1', 's2'),
	sql(q{SELECT 'acct7=1/7 ' || string_agg(e || '=' || (n > 0)::int || '/' || n, ' ' ORDER BY e)
		  FROM (SELECT e, (SELECT count(*) FROM got WHERE endpoint = e) AS n
				FROM unnest(ARRAY['s1', 's2']) e) x}),
	'and no token was taken after');
sql('DROP TABLE got');
# An account holding 2 tokens, asked 5 by each of its endpoints: the tokens
# go to the endpoint whose events have waited longest (the walk's order),
# whatever the names.
clean();
sql(qq{
SELECT ratebucket.bucket_configure('acct2', $still, 2);
SELECT ratebucket.bucket_configure(e, 1000, 1000) FROM unnest(ARRAY['aa', 'zz']) e;
INSERT INTO webhook_events (endpoint, limits, next_attempt_at)
SELECT 'zz', '{acct2}', now() - interval '1 hour' FROM generate_series(1, 5);
INSERT INTO webhook_events (endpoint, limits) SELECT 'aa', '{acct2}' FROM generate_series(1, 5);
});
is(sql(q{SELECT string_agg(endpoint || '=' || n, ' ' ORDER BY endpoint)
		 FROM (SELECT endpoint, count(*) AS n FROM claim_events(80, 5) GROUP BY endpoint) c}),
	'zz=2', 'an account short of tokens: they go to the endpoint of the best due event, not the first name');

# ------------------------------------------------------- a calendar quota --

clean();
sql(q{
SELECT ratebucket.bucket_configure_quota('q', 5, 'day', 'UTC');
SELECT ratebucket.bucket_configure(e, 1000, 1000) FROM unnest(ARRAY['q1', 'q2']) e;
INSERT INTO webhook_events (endpoint, limits)
SELECT e, '{q}' FROM unnest(ARRAY['q1', 'q2']) e, generate_series(1, 10);
});
my @per_claim = map { sql(q{SELECT count(*) FROM claim_events(80, 3)}) } 1 .. 3;
my $quota_total = 0;
$quota_total += $_ for @per_claim;
is($quota_total, 5, 'a quota of 5 as a limit: 5 events claimed over three claims ('
	  . join('+', @per_claim) . ')');
is(sql(q{SELECT quota_used || ' ' || tokens_granted FROM ratebucket.bucket_status
		 WHERE endpoint = 'q'}), '5 5', 'the quota is spent, to the last unit');
is(sql(q{SELECT sum(tokens_granted) FROM ratebucket.bucket_status
		 WHERE endpoint IN ('q1', 'q2')}), '5', 'the endpoints granted 5 tokens in all');
my ($waiting, $from, $to) = split /\|/, sql(q{
SELECT count(*),
	   round(extract(epoch FROM min(e.next_attempt_at) - b.quota_resets_at)::numeric, 3),
	   round(extract(epoch FROM max(e.next_attempt_at) - b.quota_resets_at)::numeric, 3)
FROM webhook_events e, ratebucket.bucket_status b
WHERE b.endpoint = 'q' AND e.status = 'pending' AND e.attempts = 0
GROUP BY b.quota_resets_at});
is($waiting, 15, 'the other 15 are pending, attempts unchanged');
# (Parked at now() + bucket_wait, the claim's transaction start plus a wait
# measured a moment later: a few ms early.)
ok($from > -1 && $to < 1,
	"and parked until the quota resets (from ${from} s to ${to} s of the reset)");

# ---------------------------------------------------------- in-flight cap --

clean();
sql(q{
SELECT ratebucket.inflight_configure('acct-cap', 3);
SELECT ratebucket.bucket_configure(e, 1000, 1000) FROM unnest(ARRAY['c1', 'c2', 'c3']) e;
INSERT INTO webhook_events (endpoint, inflight_key)
SELECT e, 'acct-cap' FROM unnest(ARRAY['c1', 'c2', 'c3']) e, generate_series(1, 4);
});
my $in_flight = q{SELECT in_flight FROM ratebucket.inflight_status WHERE key = 'acct-cap'};
# The slots the events hold are the cap's slots, and no other.
my $slots_match = q{
SELECT coalesce((SELECT array_agg(slot ORDER BY slot) FROM webhook_events
				 WHERE status = 'sending' AND inflight_key = 'acct-cap'), '{}')
	 = coalesce((SELECT array_agg(slot ORDER BY slot) FROM ratebucket.inflight_slots
				 WHERE key = 'acct-cap'), '{}')};
is(sql(q{SELECT count(*) FROM claim_events(80, 10)}), '3',
	'a cap of 3 over three endpoints of 4 events each: a claim gets 3');
is(sql($in_flight), '3', 'the cap holds 3');
is(sql($slots_match), 't', 'one slot for each claimed event, the slots the cap holds');
is(sql(q{SELECT sum(tokens_granted) FROM ratebucket.bucket_status}), '3',
	'tokens were spent only on the 3 events that got a slot');
is(sql(q{SELECT count(*) FROM claim_events(80, 10, cap_wait => 0)}), '0',
	'the next claim gets none, without an error');
is(sql(q{SELECT count(*) FROM webhook_events
		 WHERE status = 'pending' AND attempts = 0 AND next_attempt_at <= now()}),
	'9', 'the other 9 stay due (cap_wait => 0: a full cap parks nothing)');
my $first_sent = sql(q{SELECT min(id) FROM webhook_events WHERE status = 'sending'});
is(sql(qq{SELECT record_delivery($first_sent, 200)}), 'success', 'one outcome recorded');
is(sql($in_flight), '2', 'which freed its slot');
is(sql(q{SELECT count(*) FROM claim_events(80, 10)}), '1', 'the next claim gets 1');
is(sql($in_flight), '3', 'and the cap is full again');
is(sql($slots_match), 't', 'the slots still match the events in flight');
sql(q{SELECT record_delivery(id, 200) FROM webhook_events WHERE status = 'sending'});
is(sql($in_flight), '0', 'their outcomes free every slot');
my $expiring = sql(q{SELECT string_agg(id::text, ',' ORDER BY id)
					 FROM claim_events(80, 10, lease => '1 millisecond')});
is(scalar(split /,/, $expiring), 3, 'a claim with a lease of 1 ms gets 3');
sql(q{SELECT pg_sleep(0.05)});
is(sql(q{SELECT requeue_expired()}), '3', 'requeue_expired after the lease ran out takes back 3');
is(sql($in_flight), '0', 'and frees their slots');
is(sql(qq{SELECT string_agg(status || '/' || attempts || '/' || coalesce(slot::text, '-')
						   || '/' || coalesce(lease_until::text, '-'), ' ')
		  FROM webhook_events WHERE id IN ($expiring)}),
	'pending/0/-/- pending/0/-/- pending/0/-/-',
	'the events are pending again, attempts unchanged, holding nothing');
is(sql(q{SELECT count(*) FROM claim_events(80, 10)}), '3', 'and the next claim gets 3 again');

# A late outcome.  Worker 1 claimed the event with a lease that ran out; the
# event was requeued and claimed again by worker 2, with a slot of its own.
# Worker 1's outcome, recorded with the lease it claimed with, is stale: it
# must not free worker 2's slot nor settle worker 2's delivery.
clean();
sql(q{
SELECT ratebucket.inflight_configure('lk', 5);
SELECT ratebucket.bucket_configure('late1', 1000, 1000);
INSERT INTO webhook_events (endpoint, inflight_key) VALUES ('late1', 'lk');
});
my ($late_id, $lease1) = split /\|/,
	sql(q{SELECT id, lease_until FROM claim_events(10, 10, lease => '1 millisecond')});
sql(q{SELECT pg_sleep(0.05)});
is(sql(q{SELECT requeue_expired()}), '1', 'worker 1\'s lease ran out: the event is requeued');
my $lease2 = sql(q{SELECT lease_until FROM claim_events(10, 10)});
ok($lease2 ne '' && $lease2 ne $lease1, 'and claimed again, by worker 2, with a lease of its own');
is(sql(qq{SELECT record_delivery($late_id, 200, claimed_lease => '$lease1')}), 'stale',
	'worker 1\'s late outcome, recorded with its own lease, is stale');
is(sql(q{SELECT in_flight FROM ratebucket.inflight_status WHERE key = 'lk'}) . ' '
	 . sql(qq{SELECT status || '/' || attempts || '/' || (slot IS NOT NULL) FROM webhook_events WHERE id = $late_id}),
	'1 sending/0/true', 'worker 2\'s slot is still held, its delivery still in flight');
is(sql(qq{SELECT record_delivery($late_id, 200, claimed_lease => '$lease2')}), 'success',
	'worker 2\'s outcome is recorded');
is(sql(q{SELECT in_flight FROM ratebucket.inflight_status WHERE key = 'lk'}), '0',
	'and frees its slot');

# An endpoint held back only by a full cap is parked for cap_wait (0.5 s by
# default): no one knows when a slot frees, and left due its events would
# stay at the head of the queue.  The walk reads at most 20 x batch due
# events: 401 such events would hide the endpoint "late" behind them, which
# has tokens and due events, until a slot freed.  (Events of an
# unconfigured endpoint or limit still do: they are left alone.)
clean();
sql(q{
SELECT ratebucket.inflight_configure('full', 1);
SELECT ratebucket.bucket_configure(e, 1000, 1000) FROM unnest(ARRAY['capped', 'late']) e;
INSERT INTO webhook_events (endpoint, priority, inflight_key)
SELECT 'capped', 1, 'full' FROM generate_series(1, 401);
INSERT INTO webhook_events (endpoint) SELECT 'late' FROM generate_series(1, 5);
});
is(sql(q{SELECT count(*) FROM claim_events(15, 5)}), '1', 'a cap of 1: a claim gets 1');
# The park is measured from before the claim, not from the check, which a
# loaded machine may run some time after it.
my $before_claim = sql(q{SELECT clock_timestamp()});
is(sql(q{SELECT count(*) FROM claim_events(15, 5)}), '0',
	'the next claim gets none: the walk meets only the capped endpoint');
is(sql(qq{SELECT count(*) || ' ' || bool_and(next_attempt_at
			BETWEEN '$before_claim'::timestamptz + interval '0.4 s' AND now() + interval '2 s')
		 FROM webhook_events WHERE endpoint = 'capped' AND status = 'pending'}),
	'400 true', 'and parks its events for about cap_wait (0.5 s)');
is(sql(q{SELECT string_agg(endpoint || '=' || n, ' ' ORDER BY endpoint)
		 FROM (SELECT endpoint, count(*) AS n FROM claim_events(15, 5) GROUP BY endpoint) c}),
	'late=5', 'so the endpoint queued behind 400 events of a full cap gets its turn');
is(sql(q{SELECT count(*) FROM webhook_events WHERE endpoint = 'capped' AND attempts > 0}), '0',
	'the capped events\' attempts did not change');

# ----------------------------------------------------- unconfigured limit --

clean();
sql(qq{
SELECT ratebucket.bucket_configure(e, 1000, 1000) FROM unnest(ARRAY['u1', 'u2']) e;
SELECT ratebucket.bucket_configure('ok', $still, 5);
INSERT INTO webhook_events (endpoint, priority, limits)
SELECT 'u1', 9, '{nowhere}' FROM generate_series(1, 3);
INSERT INTO webhook_events (endpoint, priority, inflight_key)
SELECT 'u2', 9, 'nocap' FROM generate_series(1, 3);
INSERT INTO webhook_events (endpoint) SELECT 'ok' FROM generate_series(1, 3);
});
my $unconf_before = events_of(q{endpoint IN ('u1', 'u2')});
is(sql(q{SELECT string_agg(DISTINCT endpoint, ',') || ' ' || count(*) FROM claim_events(80, 10)}),
	'ok 3', 'events of an unconfigured limit or cap do not stop the claim of the others');
is(events_of(q{endpoint IN ('u1', 'u2')}), $unconf_before,
	'and are left alone: not claimed, not parked, attempts unchanged');
is(grants_of('u1', 'u2'), 'u1=0/0 u2=0/0', 'no token taken from their endpoints');
is(sql(q{SELECT count(*) FROM claim_events(80, 10)}), '0', 'a second claim: still no error');

# Limits a claim cannot take together: a striped endpoint with a limit or a
# cap, a limit that is striped.  Left alone too, never an error for the
# claim; a limit named twice, or naming the endpoint itself, counts once.
clean();
sql(qq{
SELECT ratebucket.bucket_configure(e, 1000, 1000)
FROM unnest(ARRAY['hot1', 'hot2', 'hot3', 'hotacct', 'p1', 'p2', 'acct']) e;
SELECT ratebucket.bucket_stripe(e, 2) FROM unnest(ARRAY['hot1', 'hot2', 'hot3', 'hotacct']) e;
SELECT ratebucket.inflight_configure('k', 10);
INSERT INTO webhook_events (endpoint, priority, limits) VALUES ('hot1', 9, '{acct}');
INSERT INTO webhook_events (endpoint, priority, inflight_key) VALUES ('hot2', 9, 'k');
INSERT INTO webhook_events (endpoint, priority, limits) VALUES ('p1', 9, '{hotacct}');
INSERT INTO webhook_events (endpoint, limits) VALUES ('p2', '{acct,acct,p2}');
INSERT INTO webhook_events (endpoint) VALUES ('hot3');
});
my $striped_before = events_of(q{priority = 9});
is(sql(q{SELECT string_agg(endpoint, ',' ORDER BY endpoint) FROM claim_events(80, 10)}),
	'hot3,p2', 'striped buckets with limits do not fail the claim; the others go');
is(events_of(q{priority = 9}), $striped_before,
	'the events with limits on a striped endpoint, or a striped limit, are left alone');
is(grants_of('acct'), 'acct=1/1', 'a limit named twice, and the endpoint among its limits, taken once');

# ---------------------------------------------- mixed limits on one endpoint --

# Endpoint "mix": its first due event has no limit; behind it, one whose
# limit is not configured and one whose cap does not exist.
clean();
sql(qq{
SELECT ratebucket.bucket_configure(e, 1000, 1000) FROM unnest(ARRAY['mix', 'wet', 'mp', 'mq']) e;
SELECT ratebucket.bucket_configure('dry', $still, 1);
SELECT ratebucket.bucket_take('dry', 1);
INSERT INTO webhook_events (endpoint, priority) VALUES ('mix', 1);
INSERT INTO webhook_events (endpoint, limits) VALUES ('mix', '{nowhere}');
INSERT INTO webhook_events (endpoint, inflight_key) VALUES ('mix', 'nocap');
});
my $mix_before = events_of(q{endpoint = 'mix' AND priority = 0});
is(sql(q{SELECT string_agg(endpoint, ',') FROM claim_events(80, 10)}), 'mix',
	'an endpoint with an unconfigured limit or cap behind its first event: the claim gets that event, no error');
is(events_of(q{endpoint = 'mix' AND priority = 0}), $mix_before,
	'the events answering to what is not configured are left alone');
# Endpoint "mp": its first due event answers to the empty account "dry",
# the next ones to "wet", full.  Endpoint "mq": the other way round.
clean();
sql(qq{
SELECT ratebucket.bucket_configure(e, 1000, 1000) FROM unnest(ARRAY['wet', 'mp', 'mq']) e;
SELECT ratebucket.bucket_configure('dry', $still, 1);
SELECT ratebucket.bucket_take('dry', 1);
INSERT INTO webhook_events (endpoint, priority, limits) VALUES ('mp', 1, '{dry}'), ('mq', 1, '{wet}');
INSERT INTO webhook_events (endpoint, limits)
SELECT 'mp', '{wet}'::text[] FROM generate_series(1, 3)
UNION ALL SELECT 'mq', '{dry}'::text[] FROM generate_series(1, 3);
});
my $mq_before = events_of(q{endpoint = 'mq' AND priority = 0});
is(sql(q{SELECT string_agg(endpoint, ',') FROM claim_events(80, 10)}), 'mq',
	'first claim: the event of the full account at the head of mq');
is(events_of(q{endpoint = 'mq' AND priority = 0}), $mq_before,
	'the events of mq answering to the empty account were not locked for it (untouched)');
is(sql(q{SELECT count(*) FROM webhook_events
		 WHERE endpoint = 'mp' AND limits = '{wet}' AND next_attempt_at <= now()}),
	'3', 'the events of mp answering to the full account were not parked with its head');
is(sql(q{SELECT string_agg(endpoint || '=' || n, ' ' ORDER BY endpoint)
		 FROM (SELECT endpoint, count(*) AS n FROM claim_events(80, 10) GROUP BY endpoint) c}),
	'mp=3', 'the next claim gets them');
is(sql(q{SELECT count(*) FROM webhook_events
		 WHERE limits = '{dry}' AND status = 'pending' AND attempts = 0
		   AND next_attempt_at > now() + interval '11 days'}),
	'4', 'and every event of the empty account is parked until its next token');
is(grants_of('dry'), 'dry=1/1', 'which no claim took from');

# ---------------------------------------------------------------- rollback --

clean();
sql(qq{
SELECT ratebucket.bucket_configure('ra', $still, 50);
SELECT ratebucket.bucket_configure(e, $still, 50) FROM unnest(ARRAY['r1', 'r2']) e;
SELECT ratebucket.inflight_configure('rcap', 4);
INSERT INTO webhook_events (endpoint, limits) SELECT 'r1', '{ra}' FROM generate_series(1, 20);
INSERT INTO webhook_events (endpoint, limits, inflight_key)
SELECT 'r2', '{ra}', 'rcap' FROM generate_series(1, 20);
});
my $state = q{
SELECT (SELECT string_agg(endpoint || '=' || takes_granted || '/' || tokens_granted || '/'
						  || round(tokens::numeric, 3), ' ' ORDER BY endpoint)
		FROM ratebucket.bucket_status)
	   || ' slots=' || (SELECT count(*) FROM ratebucket.inflight_slots)};
my $state_before = sql($state);
my $events_before = events_of('true');
$s1->query_safe('BEGIN');
is($s1->query_safe(q{SELECT string_agg(endpoint || '=' || n, ' ' ORDER BY endpoint)
					 FROM (SELECT endpoint, count(*) AS n FROM claim_events(80, 10)
						   GROUP BY endpoint) c}),
	'r1=10 r2=4', 'a claim that will roll back gets its batch (r2 capped at 4)');
my $state_inside = $s1->query_safe($state);
isnt($state_inside, $state_before, "inside its transaction, tokens and slots are taken ($state_inside)");
$s1->query_safe('ROLLBACK');
is(sql($state), $state_before,
	"rolling it back gave back every token and every slot ($state_before)");
is(events_of('true'), $events_before, 'and every event as it was');

# ------------------------------------------------------------- many workers --

# Account A (100/s, burst 20) over a1..a3 (80/s, burst 40 each: together far
# above A).  Account B (30/s, burst 10) over b1..b3 (50/s, burst 25), and
# B's events also under the in-flight cap capB of 5.  A recorder script
# records outcomes: any event of A, and events of B once in flight for 200
# ms (so the cap fills: 5 slots for 200 ms is at most 25/s, below B's 30/s).
# A's events are queued before B's (priority 1), so that A's demand never
# waits on B's cap: B's events, held back by their full cap, are parked for
# cap_wait, and until then they stand in the walk.
clean();
my %bucket = (
	acctA => [100, 20], a1 => [80, 40], a2 => [80, 40], a3 => [80, 40],
	acctB => [30, 10],  b1 => [50, 25], b2 => [50, 25], b3 => [50, 25]);
sql(join "\n", map {
	"SELECT ratebucket.bucket_configure('$_', $bucket{$_}[0], $bucket{$_}[1]);"
} sort keys %bucket);
sql(q{
SELECT ratebucket.inflight_configure('capB', 5);
INSERT INTO webhook_events (endpoint, priority, limits)
SELECT 'a' || (1 + g % 3), 1, '{acctA}' FROM generate_series(1, 6000) g;
INSERT INTO webhook_events (endpoint, priority, limits, inflight_key)
SELECT 'b' || (1 + g % 3), 0, '{acctB}', 'capB' FROM generate_series(1, 6000) g;
ANALYZE webhook_events;
CREATE TABLE claim_log (id bigint PRIMARY KEY, endpoint text NOT NULL,
						at timestamptz NOT NULL DEFAULT clock_timestamp());
-- the slots of capB held, counted in each claim's transaction after it
CREATE TABLE cap_log (n bigint NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE TABLE record_log (id bigint PRIMARY KEY, outcome text NOT NULL,
						 at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE SEQUENCE rolled_back;
});
my $seconds = 5;
$node->pgbench(
	"--no-vacuum --client=8 --jobs=2 --time=$seconds --protocol=prepared",
	0,
	[qr/processed: [1-9]/, qr/number of failed transactions: 0 \(0\.000%\)/],
	[qr/^$/],
	'8 workers claim, roll back and record concurrently, without an error',
	{
		# The count runs in the claim's transaction: a claim that acquired
		# slots of capB holds the cap's row until it commits, so no other
		# claim adds a slot meanwhile; only outcomes may free some.  The
		# count is the most that were held when it commits.
		'claim@4' => q{
BEGIN;
INSERT INTO claim_log (id, endpoint) SELECT id, endpoint FROM claim_events(15, 5);
INSERT INTO cap_log (n) SELECT count(*) FROM ratebucket.inflight_slots WHERE key = 'capB';
COMMIT;
},
		'claim_rollback@1' => q{
BEGIN;
SELECT nextval('rolled_back') FROM claim_events(15, 5);
ROLLBACK;
},
		# One outcome per transaction: record_delivery locks its event, then
		# its endpoint's bucket, then frees the slot.
		'record@3' => q{
INSERT INTO record_log (id, outcome)
SELECT x.id, record_delivery(x.id, 200)
FROM (SELECT id FROM webhook_events
	  WHERE status = 'sending'
		AND (inflight_key IS NULL
			 OR lease_until <= now() + interval '30 s' - interval '200 ms')
	  ORDER BY lease_until LIMIT 1
	  FOR UPDATE SKIP LOCKED) x;
},
	});

# Every bucket: granted = the logged claims whose endpoint or limits name
# it; within rate*T + capacity (T from its creation to its last grant).
# What it offered counts from the first claim logged that took from it (the
# refill lost to a full bucket while pgbench started is not the claim's) to
# the last claim logged of the run, not to its own last grant: a bucket
# starved for the end of the run must not look efficient.
my $per_bucket = sql(q{
WITH took AS (
	SELECT k.key, l.at
	FROM claim_log l JOIN webhook_events e USING (id)
	CROSS JOIN LATERAL unnest(ARRAY[e.endpoint] || e.limits) AS k(key))
SELECT b.endpoint, b.conf_rate, b.conf_capacity, b.tokens_granted,
	   (SELECT count(*) FROM took t WHERE t.key = b.endpoint),
	   extract(epoch FROM coalesce(b.last_used, b.created_at) - b.created_at),
	   extract(epoch FROM (SELECT max(l.at) FROM claim_log l)
						  - (SELECT min(t.at) FROM took t WHERE t.key = b.endpoint))
FROM ratebucket.bucket_status b ORDER BY b.endpoint});
my %row;
for my $line (split /\n/, $per_bucket)
{
	my ($key, $r, $cap, $granted, $logged, $t, $busy) = split /\|/, $line;
	my $bound = $r * $t + $cap;
	my $offered = $r * ($busy || 0) + $cap;
	$row{$key} = { granted => $granted, offered => $offered };
	is($granted, $logged, "$key: tokens granted = events claimed that take from it ($logged)");
	ok($granted <= $bound + 1e-6,
		sprintf("%s: %d granted within rate*T + capacity = %.1f (%.1f%%; %.1f%% of what it offered during the run)",
			$key, $granted, $bound, 100 * $granted / $bound, 100 * $granted / $offered));
}
# Account A binds: its endpoints could grant 2.4 times its rate.  It granted
# nearly all it offered, its endpoints together far less than theirs.
ok($row{acctA}{granted} >= 0.80 * $row{acctA}{offered},
	sprintf('acctA binds: efficiency %.1f%% >= 80%%',
		100 * $row{acctA}{granted} / $row{acctA}{offered}));
my ($a_granted, $a_offered) = (0, 0);
for my $ep (qw(a1 a2 a3))
{
	$a_granted += $row{$ep}{granted};
	$a_offered += $row{$ep}{offered};
}
ok($a_granted < 0.60 * $a_offered,
	sprintf('a1..a3 granted %d, %.1f%% of what they offered together (< 60%%: the account held them back)',
		$a_granted, 100 * $a_granted / $a_offered));
my ($checks, $max_held, $at_cap) = split /\|/, sql(q{
SELECT count(*), max(n), count(*) FILTER (WHERE n = 5) FROM cap_log});
ok($max_held <= 5,
	"in flight never above the cap: at most $max_held of 5 held, over $checks claims");
is($max_held, 5, "and the cap was reached ($at_cap claims committed with 5 held)");
is(sql(q{
SELECT coalesce((SELECT array_agg(slot ORDER BY slot) FROM webhook_events
				 WHERE status = 'sending' AND inflight_key = 'capB'), '{}')
	 = coalesce((SELECT array_agg(slot ORDER BY slot) FROM ratebucket.inflight_slots
				 WHERE key = 'capB'), '{}')}),
	't', 'at the end, the slots held are exactly those of the events in flight');
is(sql(q{SELECT count(*) FROM claim_log l JOIN webhook_events e USING (id)
		 WHERE e.status NOT IN ('sending', 'delivered')}), '0',
	'every logged claim is in flight or delivered');
is(sql(q{SELECT count(*) FROM webhook_events WHERE status IN ('sending', 'delivered')}),
	sql(q{SELECT count(*) FROM claim_log}),
	'and every event in flight or delivered was logged once: none claimed twice');
is(sql(q{SELECT count(*) FILTER (WHERE outcome = 'success') || '/' || count(*) FROM record_log}),
	sql(q{SELECT count(*) || '/' || count(*) FROM webhook_events WHERE status = 'delivered'}),
	'every outcome recorded delivered its event');
is(sql(q{SELECT count(*) FROM webhook_events
		 WHERE attempts <> CASE WHEN status = 'delivered' THEN 1 ELSE 0 END}), '0',
	'claims, refusals and parking never count an attempt; an outcome counts one');
ok(sql(q{SELECT is_called FROM rolled_back}) eq 't',
	'some claims rolled back (their grants did not count)');
note(sql(q{SELECT 'claimed ' || count(*) || ' events (A ' || count(*) FILTER (WHERE endpoint LIKE 'a%')
				  || ', B ' || count(*) FILTER (WHERE endpoint LIKE 'b%') || '); recorded '
				  || (SELECT count(*) FROM record_log) || '; claims rolled back '
				  || (SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM rolled_back)
		  FROM claim_log}));

$s1->quit;
$node->stop;
done_testing();
