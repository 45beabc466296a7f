# 014_citus.pl — ratebucket on a Citus cluster: a coordinator and two
# workers, each a PostgreSQL server started here, with Citus loaded.
#
# ratebucket.distribute() distributes the tables by endpoint and registers
# the per-endpoint functions as distributed functions, so that a bare
# SELECT of one, sent to the coordinator, runs on the worker that holds its
# endpoint, under the row lock there.  Checked:
#
#   - distribute() is idempotent, and says what it did;
#   - a take sent to the coordinator is delegated to the endpoint's worker
#     (EXPLAIN names the worker and the call), and the row lives there;
#   - the configured take, bucket_observe and the peeks work on
#     distributed rows (they did not: the direct path read the empty
#     distributed table's shell, and updates by ctid went to every shard);
#   - bucket_take_all and bucket_take_batch over endpoints on both workers,
#     all or nothing; no event sent (doc/events.md), heard by listeners on
#     every node; templates configuring an endpoint on its worker, a
#     change on the coordinator and a first use on a worker waiting for
#     each other;
#   - the status view over the workers (a striped endpoint's stripes live on
#     other shards), in-flight caps with slot ids unique over the nodes,
#     expiry on every shard;
#   - the queue distributed beside the buckets (distribute_queue): a bare
#     claim_endpoint or record_endpoint runs on the endpoint's worker; 8
#     clients claiming at random spend exactly one token per event claimed
#     and claim none twice; record_endpoint and explain_endpoint there;
#   - the reference dispatcher with --by-endpoint delivering a distributed
#     queue to demo/simulator: all delivered, none twice, one request per
#     event, no 429, each destination within rate*(T + d) + capacity, d
#     the longest from a claim sent to its request's arrival;
#   - 8 clients over 200 endpoints through the coordinator: 0 failed
#     transactions; per endpoint, the grants the clients saw = the row's
#     takes_granted <= rate*T + capacity by the row's own clock;
#   - a worker killed (SIGKILL) under that load: after its crash recovery
#     no endpoint has lost a take its client saw committed, and the bound
#     holds;
#   - a shard moved to the other worker (citus_move_shard_placement) under
#     that load: 0 failed transactions, every grant counted, the bound kept,
#     and the moved endpoints taken from on their new worker.
#
# Skipped, saying so, where Citus is not installed (build it with
# ../shared/citus/build-citus, or let ./test/run do it: see
# doc/guarantees.md).

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes;
use IPC::Run;

use lib 'test/perl';
use RatebucketTest;

my $probe = PostgreSQL::Test::Cluster->new('probe');
my $libdir = $probe->config_data('--pkglibdir');
plan skip_all => "Citus is not installed ($libdir/citus.so is missing): "
  . 'build it with ../shared/citus/build-citus'
  unless -e "$libdir/citus.so";

# ------------------------------------------------------------ the cluster --

my $conf = q{
shared_preload_libraries = 'citus,ratebucket'
max_connections = 100
max_prepared_transactions = 100
citus.shard_count = 8
wal_level = logical
ratebucket.events = on
};
# (ratebucket.events on: none may be sent all the same, where the table is
# distributed)
my @nodes = map { new_node($_, conf => $conf) } qw(coordinator worker1 worker2);
# A node that connects to itself (a shard move, the recovery of two-phase
# commits) does so over the socket the tests use.
$_->append_conf('postgresql.conf', "citus.local_hostname = '" . $_->host . "'\n") for @nodes;
$_->start for @nodes;
my ($coord, @workers) = @nodes;
$_->safe_psql('postgres', 'CREATE EXTENSION citus') for @nodes;
$coord->safe_psql('postgres', sprintf(
	q{SELECT citus_set_coordinator_host('%s', %d)}, $coord->host, $coord->port));
$coord->safe_psql('postgres', sprintf(
	q{SELECT citus_add_node('%s', %d)}, $_->host, $_->port)) for @workers;
is($coord->safe_psql('postgres', 'SELECT count(*) FROM citus_get_active_worker_nodes()'),
	'2', 'a coordinator and two workers');

# The extension, created on the coordinator: Citus creates it on the workers.
$coord->safe_psql('postgres', 'CREATE EXTENSION ratebucket');
for my $w (@workers)
{
	is($w->safe_psql('postgres',
			q{SELECT extversion FROM pg_extension WHERE extname = 'ratebucket'}),
		$coord->safe_psql('postgres',
			q{SELECT extversion FROM pg_extension WHERE extname = 'ratebucket'}),
		$w->name . ': ratebucket created there by Citus');
}

# ------------------------------------------------------------ distribute --

# One session, as an application's long-lived connection would be: an
# endpoint given a token reserve while the table is still local (bucket_reserve
# refuses a distributed one), taken from (a refill through the row, then
# draws from this node's shared memory, which the session now knows of);
# then distribute(); then takes again.  Once the table is distributed the
# reserve serves no take: the takes on the coordinator (in a FROM list, not
# delegated) and those delegated to the endpoint's worker all go through
# its row, and no refill moves tokens into any node's memory.
# Each take a statement of its own, so a transaction of its own (a refill's
# tokens are drawable once it commits); in a join, so that Citus runs the
# call on the coordinator rather than send it to the endpoint's worker.
# (Not a join with VALUES or a subquery: planning one crashes Citus 13.2,
# doc/citus.md.)
my $take_here = q{SELECT count(*) FILTER (WHERE t.allowed) AS n
FROM generate_series(1, 1) AS g, LATERAL ratebucket.bucket_take('reserved:early') AS t \gset
SELECT :taken + :n AS taken \gset
};
my $session = $coord->safe_psql('postgres', q{
SELECT ratebucket.bucket_configure('reserved:early', 1000, 1000) IS NULL AS c \gset
SELECT ratebucket.bucket_reserve('reserved:early', 100) IS NULL AS r \gset
SELECT 0 AS taken \gset
} . ($take_here x 5) . q{
SELECT :taken AS early_taken \gset
SELECT draws AS early_draws FROM ratebucket.bucket_reserves() WHERE endpoint = 'reserved:early' \gset
SELECT string_agg(object || ': ' || action, E'\n' ORDER BY object) AS did
FROM ratebucket.distribute() \gset
SELECT takes_granted AS row_before FROM ratebucket.bucket_status
WHERE endpoint = 'reserved:early' \gset
SELECT 0 AS taken \gset
} . ($take_here x 20) . q{
SELECT allowed AS d1 FROM ratebucket.bucket_take('reserved:early') \gset
SELECT allowed AS d2 FROM ratebucket.bucket_take('reserved:early') \gset
SELECT allowed AS d3 FROM ratebucket.bucket_take('reserved:early') \gset
SELECT takes_granted - :row_before AS row_added FROM ratebucket.bucket_status
WHERE endpoint = 'reserved:early' \gset
SELECT coalesce((SELECT draws FROM ratebucket.bucket_reserves()
                 WHERE endpoint = 'reserved:early'), 0) AS late_draws \gset
SELECT :early_taken, :early_draws, :taken, :'d1' || :'d2' || :'d3', :row_added, :late_draws;
\echo :did
});
my ($figures, $did) = split /\n/, $session, 2;
my ($early_taken, $early_draws, $late_taken, $delegated, $row_added, $late_draws) = split /\|/, $figures;
is($early_taken, 5, 'before distribute(): five takes of an endpoint with a reserve');
is($early_draws, 4, '... of which the reserve served all but the first, the refill');
note($did);
like($did, qr{^ratebucket\.buckets: distributed by endpoint$}m, 'buckets distributed by endpoint');
like($did, qr{^ratebucket\.bucket_take\(text,double precision,double precision,double precision\): delegated}m,
	'the explicit take delegated');
my $again = $coord->safe_psql('postgres',
	q{SELECT count(*) FILTER (WHERE action LIKE 'already%') || ' of ' || count(*) FROM ratebucket.distribute()});
like($again, qr{^(\d+) of \1$}, "distribute() again changes nothing ($again already so)");
is("$late_taken $delegated", '20 ttt',
	'distributed, the same session: twenty takes on the coordinator and three delegated, granted');
is($row_added, 23, '... every one counted in its row (none drawn from a reserve)');
is($late_draws, $early_draws, "... and the coordinator's reserve drew no more");
is($_->safe_psql('postgres', q{SELECT count(*) FROM ratebucket.bucket_reserves()}), '0',
	$_->name . ': no reserve refilled there')
  for @workers;

# --------------------------------------------------------------- delegated --

# The worker that holds an endpoint's shard, by Citus's catalog.
sub owner_port
{
	my ($endpoint) = @_;
	return $coord->safe_psql('postgres', qq{
		SELECT n.nodeport FROM pg_dist_placement p JOIN pg_dist_node n USING (groupid)
		WHERE p.shardid = get_shard_id_for_distribution_column('ratebucket.buckets', '$endpoint'::text)});
}

for my $call (q{SELECT allowed FROM ratebucket.bucket_take('ep:1', 0.001, 20)},
	q{SELECT allowed FROM ratebucket.bucket_take('load:' || 7, 50, 10)})
{
	my $plan = $coord->safe_psql('postgres', "EXPLAIN (VERBOSE, COSTS OFF) $call");
	note($plan);
	my ($port) = $plan =~ /port=(\d+)/;
	my ($endpoint) = $call =~ /bucket_take\('([^']*)'/;
	$endpoint .= '7' if $endpoint eq 'load:';
	like($plan, qr{SELECT .*ratebucket\.bucket_take\(}, "EXPLAIN $endpoint: the call itself is sent on");
	is($port // 'none', owner_port($endpoint),
		"EXPLAIN $endpoint: to the worker that holds the endpoint's shard");
}

is($coord->safe_psql('postgres', q{SELECT allowed FROM ratebucket.bucket_take('ep:1', 0.001, 20)}),
	't', 'a take of a new endpoint through the coordinator');
is($coord->safe_psql('postgres', q{SELECT round(remaining) FROM ratebucket.bucket_take('ep:1', 0.001, 20)}),
	'18', 'the second take finds the row the first made (it did not: 40001 after 1,000 tries)');

# The configured take, feedback and peeks on distributed rows.
$coord->safe_psql('postgres', q{SELECT ratebucket.bucket_configure('ep:conf', 0.001, 3)});
is($coord->safe_psql('postgres', q{SELECT allowed || ' ' || remaining FROM ratebucket.bucket_take('ep:conf', 2)}),
	'true 1', 'a configured take of a configured endpoint (it said "not configured")');
is($coord->safe_psql('postgres', q{SELECT ratebucket.bucket_ready('ep:conf', 2)}),
	'f', 'bucket_ready says what the row holds');
is($coord->safe_psql('postgres', q{SELECT outcome || ' ' || cooldown_seconds FROM ratebucket.bucket_observe('ep:conf', 429, '60')}),
	'throttled 60', 'bucket_observe records a 429 with its Retry-After');
is($coord->safe_psql('postgres', q{
	SELECT throttles || ' ' || (cooldown_until > now())
	FROM ratebucket.buckets WHERE endpoint = 'ep:conf'}),
	'1 true', 'the 429 is in the row');

# Several buckets at once, on both workers: bucket_take_all and
# bucket_take_batch run on the coordinator, which locks each row on its
# worker, in the same order as on one node, and commits on both.
$coord->safe_psql('postgres', q{
SELECT ratebucket.bucket_configure('many:' || i, 0.001, 5) FROM generate_series(1, 6) AS i});
is($coord->safe_psql('postgres', qq{
	SELECT count(DISTINCT n.nodeport) FROM generate_series(1, 6) AS i
	JOIN pg_dist_placement p
	  ON p.shardid = get_shard_id_for_distribution_column('ratebucket.buckets', 'many:' || i)
	JOIN pg_dist_node n USING (groupid)}), '2', 'six endpoints over both workers');
is($coord->safe_psql('postgres', q{
	SELECT allowed || ' ' || ARRAY(SELECT round(r::numeric) FROM unnest(remaining) AS r)::text
	FROM ratebucket.bucket_take_all(ARRAY['many:1', 'many:2', 'many:3', 'many:4', 'many:5', 'many:6'],
	                                ARRAY[1, 2, 3, 4, 5, 1]::float8[])}),
	'true {4,3,2,1,0,4}', 'bucket_take_all over both workers: all granted, each row taken from');
is($coord->safe_psql('postgres', q{
	SELECT allowed || ' ' || ARRAY(SELECT round(r::numeric) FROM unnest(remaining) AS r)::text
	FROM ratebucket.bucket_take_all(ARRAY['many:1', 'many:5'], ARRAY[1, 1]::float8[])}),
	'false {4,0}', 'all or nothing: many:5 is empty, so many:1 keeps its tokens');
is($coord->safe_psql('postgres', q{
	SELECT string_agg(request || ':' || granted, ' ' ORDER BY request)
	FROM ratebucket.bucket_take_batch(ARRAY[ROW(ARRAY['many:1', 'many:6'], 3, NULL),
	                                        ROW(ARRAY['many:6'], 3, NULL)]::ratebucket.batch_request[])}),
	'1:3 2:1', 'bucket_take_batch over both workers: the shared bucket granted in order');
is($coord->safe_psql('postgres', q{
	SELECT string_agg(endpoint || '=' || round(tokens::numeric), ' ' ORDER BY endpoint)
	FROM ratebucket.buckets WHERE endpoint IN ('many:1', 'many:6')}),
	'many:1=1 many:6=0', 'and the rows say so');

# No events on a distributed table (doc/events.md): a listener on every node
# hears nothing while breakers open and endpoints are paused on both workers,
# by delegated calls and in one transaction over both.
my @listeners = map {
	my $node = $_;
	my %l = (in => "LISTEN ratebucket_events;\n\\echo ready\n", out => '');
	$l{h} = IPC::Run::start(
		[ 'psql', '-X', '-A', '-t', '-h', $node->host, '-p', $node->port, '-d', 'postgres' ],
		'<', \$l{in}, '>', \$l{out}, '2>', \$l{out});
	$l{h}->pump until $l{out} =~ /^ready$/m;
	\%l;
} ($coord, @workers);
$coord->safe_psql('postgres', q{
SELECT ratebucket.bucket_configure('ev:' || i, 0.001, 5, breaker_failures => 1) FROM generate_series(1, 6) AS i});
is($coord->safe_psql('postgres', qq{
	SELECT count(DISTINCT n.nodeport) FROM generate_series(1, 6) AS i
	JOIN pg_dist_placement p
	  ON p.shardid = get_shard_id_for_distribution_column('ratebucket.buckets', 'ev:' || i)
	JOIN pg_dist_node n USING (groupid)}), '2', 'ev:1 to ev:6 over both workers');
$coord->safe_psql('postgres', qq{SELECT ratebucket.bucket_observe('ev:$_', 500)}) for 1 .. 6;
$coord->safe_psql('postgres', q{BEGIN;
	SELECT ratebucket.bucket_pause('ev:' || i) FROM generate_series(1, 6) AS i;
	SELECT ratebucket.bucket_resume('ev:1'); SELECT ratebucket.bucket_observe('ev:2', 500);
	COMMIT;});
is($coord->safe_psql('postgres', q{
	SELECT count(*) FILTER (WHERE breaker_opens = 1) || ' ' || count(paused_until)
	FROM ratebucket.buckets WHERE endpoint LIKE 'ev:_'}), '6 5',
	'breakers opened on the six endpoints, five of them paused');
for my $l (@listeners)
{
	$l->{in} .= "SELECT 'listened';\n\\q\n";
	$l->{h}->finish;
}
is_deeply([ map { scalar(() = $_->{out} =~ /Asynchronous notification/g) } @listeners ], [ 0, 0, 0 ],
	'listeners on the coordinator and both workers heard no event');
like($listeners[1]{out}, qr/listened/, 'and they were listening');

# Templates: a reference table, read on the worker where a delegated take
# meets an endpoint nobody configured; a change reaches it there.
$coord->safe_psql('postgres', q{SELECT ratebucket.bucket_template('tpl:*', 0.001, 7)});
is($coord->safe_psql('postgres', q{SELECT remaining FROM ratebucket.bucket_take('tpl:a')}),
	'6', "a worker configures an endpoint from its template at its first take");
is($coord->safe_psql('postgres', q{SELECT ratebucket.bucket_template('tpl:*', 0.001, 3)}),
	'1', 'a change of the template is carried to it');
is($coord->safe_psql('postgres', q{
	SELECT conf_capacity || ' ' || template || ' ' || round(tokens::numeric)
	FROM ratebucket.buckets WHERE endpoint = 'tpl:a'}),
	'3 tpl:* 3', 'the row on its worker follows the template');

# A change of a template on the coordinator and a first use on a worker
# wait for each other, as on one node (the lock was this node's only): a
# first use while a change is open gets the new values; a change while a
# first use is open reaches that endpoint once it commits.
sub psql_session
{
	my (@sql) = @_;
	my ($out, $err) = ('', '');
	my $h = IPC::Run::start(
		[ 'psql', '-X', '-A', '-t', '-h', $coord->host, '-p', $coord->port, '-d', 'postgres',
		  map { ('-c', $_) } @sql ],
		'>', \$out, '2>', \$err);
	return ($h, \$out, \$err);
}
$coord->safe_psql('postgres', q{SELECT ratebucket.bucket_template('lk:*', 0.001, 3)});
my ($chg) = psql_session('BEGIN', q{SELECT ratebucket.bucket_template('lk:*', 0.001, 9)},
	'SELECT pg_sleep(1.5)', 'COMMIT');
Time::HiRes::sleep(0.5);
my $t_use = Time::HiRes::time();
is($coord->safe_psql('postgres', q{SELECT remaining FROM ratebucket.bucket_take('lk:a')}),
	'8', 'a first use on a worker while a change is open takes the new template (9 - 1)');
my $use_waited = Time::HiRes::time() - $t_use;
$chg->finish;
cmp_ok($use_waited, '>', 0.5, sprintf('it waited for the change to commit (%.2f s)', $use_waited));
my ($use) = psql_session('BEGIN', q{SELECT remaining FROM ratebucket.bucket_take('lk:b')},
	'SELECT pg_sleep(1.5)', 'COMMIT');
Time::HiRes::sleep(0.5);
my $t_chg = Time::HiRes::time();
is($coord->safe_psql('postgres', q{SELECT ratebucket.bucket_template('lk:*', 0.001, 4)}),
	'2', 'a change while a first use is open reaches both endpoints');
my $chg_waited = Time::HiRes::time() - $t_chg;
$use->finish;
cmp_ok($chg_waited, '>', 0.5, sprintf('it waited for the first use to commit (%.2f s)', $chg_waited));
is($coord->safe_psql('postgres', q{
	SELECT string_agg(endpoint || '=' || conf_capacity, ' ' ORDER BY endpoint)
	FROM ratebucket.buckets WHERE endpoint LIKE 'lk:%'}),
	'lk:a=4 lk:b=4', 'both follow the template as last changed');

# The status view on the cluster: a striped endpoint's stripes hash to other
# shards than its own row, and the view sums them there (it failed: "complex
# joins are only supported ..."; and a shard's row met functions that take
# ratebucket.buckets).
$coord->safe_psql('postgres', q{
SELECT ratebucket.bucket_configure('hot', 0.001, 40);
SELECT ratebucket.bucket_stripe('hot', 4);});
$coord->safe_psql('postgres', q{SELECT ratebucket.bucket_take('hot')}) for 1 .. 6;
is($coord->safe_psql('postgres', q{
	SELECT count(DISTINCT n.nodeport) FROM generate_series(0, 3) AS i
	JOIN pg_dist_placement p
	  ON p.shardid = get_shard_id_for_distribution_column('ratebucket.buckets',
	                                                       ratebucket.stripe_key('hot', i, 4))
	JOIN pg_dist_node n USING (groupid)}), '2', "hot's four stripes live on both workers");
is($coord->safe_psql('postgres', q{
	SELECT stripes || ' ' || round(tokens::numeric) || ' ' || takes_granted
	FROM ratebucket.bucket_status WHERE endpoint = 'hot'}),
	'4 34 6', 'bucket_status sums the stripes over the workers: 40 - 6 tokens, 6 takes');
is($coord->safe_psql('postgres', q{
	SELECT count(*) || ' ' || count(*) FILTER (WHERE tokens IS NULL)
	FROM ratebucket.bucket_status}),
	$coord->safe_psql('postgres', q{
	SELECT count(*) || ' 0' FROM ratebucket.buckets WHERE octet_length(endpoint) <= 1024}),
	'bucket_status: one row per endpoint of the cluster, each with its tokens');

# endpoint_limits over the cluster: what holds each endpoint, a striped
# one's stripes summed.
is($coord->safe_psql('postgres', q{
	SELECT string_agg(endpoint || ':' || coalesce(held_by, '-') || ':' || stripes, ' ' ORDER BY endpoint)
	FROM ratebucket.endpoint_limits WHERE endpoint IN ('ep:conf', 'hot', 'many:5')}),
	'ep:conf:cooldown:1 hot:-:4 many:5:no tokens:1', 'endpoint_limits on the cluster says what holds each endpoint');

# In-flight caps, delegated: the slots of a key live with it.  Slot ids are
# unique over the cluster: a call the coordinator does not delegate (part of
# a larger query) acquires through the coordinator's sequence, a delegated
# one through the worker's (before, both started at 1 and the second
# acquire of a key failed on its primary key).
$coord->safe_psql('postgres', q{SELECT ratebucket.inflight_configure('cap:' || i, 3) FROM generate_series(1, 4) AS i});
my @delegated = map {
	$coord->safe_psql('postgres', qq{SELECT ratebucket.inflight_acquire('cap:$_', 2)})
} 1 .. 4;
my $nested = $coord->safe_psql('postgres', q{
	SELECT string_agg(s::text, ',') FROM generate_series(1, 4) AS i,
	     unnest(ratebucket.inflight_acquire('cap:' || i, 2)) AS s});
my @all = map { /(\d+)/g } @delegated, $nested;
is(scalar(@all), 12, 'two slots of each cap delegated, then one more each (the cap is 3)');
my %seen;
$seen{$_}++ for @all;
is(scalar(keys %seen), 12, 'no slot id handed out twice over the nodes: ' . join(',', sort @all));
is($coord->safe_psql('postgres', q{SELECT ratebucket.inflight_acquire('cap:1')}),
	'{}', 'the cap holds: a fourth slot is refused');
my ($s1) = $delegated[0] =~ /(\d+)/;
is($coord->safe_psql('postgres', qq{SELECT ratebucket.inflight_renew('cap:1', ARRAY[$s1]::bigint[], '1 hour')}),
	'1', 'inflight_renew on a worker (it failed: a volatile clock in a distributed UPDATE)');
is($coord->safe_psql('postgres', qq{SELECT ratebucket.inflight_release('cap:1', ARRAY[$s1]::bigint[])}),
	'1', 'inflight_release frees it');
is($coord->safe_psql('postgres', q{
	SELECT string_agg(key || '=' || in_flight, ' ' ORDER BY key) FROM ratebucket.inflight_status}),
	'cap:1=2 cap:2=3 cap:3=3 cap:4=3', 'inflight_status over the cluster');
# An expired slot is reclaimed by the next acquire, on the worker (the
# reclaim deleted by ctid, which Citus refuses).
$coord->safe_psql('postgres', q{SELECT ratebucket.inflight_configure('cap:short', 1, '10 ms')});
$coord->safe_psql('postgres', q{SELECT ratebucket.inflight_acquire('cap:short')});
select(undef, undef, undef, 0.05);
is($coord->safe_psql('postgres', q{SELECT cardinality(ratebucket.inflight_acquire('cap:short'))}),
	'1', 'an expired slot is reclaimed by the next acquire');

# Expiry runs on each shard: the idle, full, unconfigured buckets go, on
# both workers; configured ones stay (it failed: FOR UPDATE over shards).
$coord->safe_psql('postgres', q{SELECT ratebucket.bucket_take('idle:' || i, 1000, 1) FROM generate_series(1, 12) AS i});
select(undef, undef, undef, 0.05);
my $idle_before = $coord->safe_psql('postgres', q{SELECT count(*) FROM ratebucket.buckets WHERE endpoint LIKE 'idle:%'});
my $kept_before = $coord->safe_psql('postgres', q{SELECT count(*) FROM ratebucket.buckets WHERE conf_rate IS NOT NULL});
ok($coord->safe_psql('postgres', q{SELECT ratebucket.bucket_expire('0')}) >= 12,
	'bucket_expire deletes on the workers');
is($coord->safe_psql('postgres', q{SELECT count(*) FROM ratebucket.buckets WHERE endpoint LIKE 'idle:%'}),
	'0', "the $idle_before idle buckets are gone from both workers");
is($coord->safe_psql('postgres', q{SELECT count(*) FROM ratebucket.buckets WHERE conf_rate IS NOT NULL}),
	$kept_before, 'the configured buckets are kept');

# ------------------------------------------------------------- the queue --

# ratebucket_queue, distributed beside the buckets: each endpoint's events
# on the node of its bucket, claimed there by claim_endpoint.
$coord->safe_psql('postgres', 'CREATE SCHEMA outbox; CREATE EXTENSION ratebucket_queue SCHEMA outbox');
my $qdid = $coord->safe_psql('postgres',
	q{SELECT string_agg(object || ': ' || action, E'\n' ORDER BY object) FROM outbox.distribute_queue()});
note($qdid);
like($qdid, qr{^outbox\.webhook_events: distributed by endpoint, co-located with ratebucket\.buckets$}m,
	'distribute_queue: the events distributed by endpoint, beside the buckets');
like($qdid, qr{^outbox\.claim_endpoint\(.*\): delegated}m, 'claim_endpoint delegated');
my $qagain = $coord->safe_psql('postgres',
	q{SELECT count(*) FILTER (WHERE action LIKE 'already%') || ' of ' || count(*) FROM outbox.distribute_queue()});
like($qagain, qr{^(\d+) of \1$}, "distribute_queue() again changes nothing ($qagain already so)");

# 20 endpoints at 20/s in bursts of 5, 120 events each: more than 3 s of
# claims can take.
my ($q_endpoints, $q_events, $q_rate, $q_capacity) = (20, 120, 20, 5);
$coord->safe_psql('postgres', qq{
SELECT ratebucket.bucket_configure('q:' || i, $q_rate, $q_capacity) FROM generate_series(1, $q_endpoints) AS i;
INSERT INTO outbox.webhook_events (endpoint, payload)
SELECT 'q:' || i, jsonb_build_object('n', n)
FROM generate_series(1, $q_endpoints) AS i, generate_series(1, $q_events) AS n;});
is($coord->safe_psql('postgres', qq{
	SELECT count(*) FROM generate_series(1, $q_endpoints) AS i,
	     LATERAL (SELECT get_shard_id_for_distribution_column('outbox.webhook_events', 'q:' || i) AS es,
	                     get_shard_id_for_distribution_column('ratebucket.buckets', 'q:' || i) AS bs) AS s
	WHERE (SELECT groupid FROM pg_dist_placement WHERE shardid = s.es)
	      <> (SELECT groupid FROM pg_dist_placement WHERE shardid = s.bs)
	   OR (SELECT shardminvalue FROM pg_dist_shard WHERE shardid = s.es)
	      <> (SELECT shardminvalue FROM pg_dist_shard WHERE shardid = s.bs)}),
	'0', "every endpoint's events on the node of its bucket");
my $cplan = $coord->safe_psql('postgres', q{EXPLAIN (VERBOSE, COSTS OFF) SELECT * FROM outbox.claim_endpoint('q:3', 5)});
my ($cport) = $cplan =~ /port=(\d+)/;
like($cplan, qr{Task Count: 1}, 'a bare claim_endpoint is one task');
is($cport // 'none', owner_port('q:3'), "sent to the worker that holds q:3");
my $due = $coord->safe_psql('postgres', qq{SELECT count(*) || ' ' || sum(due) FROM outbox.due_endpoints($q_endpoints)});
is($due, "$q_endpoints " . $q_endpoints * $q_events, 'due_endpoints lists every endpoint and its due events');

# 8 clients, each claiming an endpoint at random with a bare (delegated)
# claim_endpoint, for 3 s: far more demand than the buckets grant.  Every
# claimed event is then sending under a 30 s lease, so per endpoint the
# tokens its bucket granted must equal its events sending: a token spent
# on an event not claimed, or an event claimed twice (two grants for one
# event), would make them differ.
$coord->pgbench(
	"-n -c 8 -j 2 -T 3",
	0,
	[ qr{number of failed transactions: 0 \(0\.000%\)} ],
	[ qr{^$} ],
	'8 clients claiming through the coordinator: no failed transaction',
	{ '014_citus_claim' => qq{
\\set e random(1, $q_endpoints)
SELECT * FROM outbox.claim_endpoint('q:' || :e, 5);
} });
my ($q_claimed, $q_granted, $q_diff, $q_over) = split /\|/, $coord->safe_psql('postgres', qq{
WITH e AS (SELECT endpoint, count(*) FILTER (WHERE status = 'sending') AS sending
           FROM outbox.webhook_events GROUP BY endpoint),
     b AS (SELECT endpoint, tokens_granted,
                  $q_rate * extract(epoch FROM last_granted_at - created_at) + $q_capacity AS bound
           FROM ratebucket.buckets WHERE endpoint LIKE 'q:%')
SELECT sum(e.sending), sum(b.tokens_granted),
       count(*) FILTER (WHERE e.sending IS DISTINCT FROM b.tokens_granted::bigint),
       count(*) FILTER (WHERE b.tokens_granted > b.bound + 1e-6)
FROM e FULL JOIN b USING (endpoint)});
note("claimed $q_claimed events, tokens granted $q_granted");
cmp_ok($q_claimed, '>', $q_endpoints * $q_capacity, "the clients claimed events ($q_claimed)");
cmp_ok($q_claimed, '<', $q_endpoints * $q_events, 'and the buckets held some back: demand was above the rates');
is($q_diff, '0', "per endpoint, one token per event claimed and none claimed twice ($q_claimed claimed, $q_granted tokens)");
is($q_over, '0', 'no endpoint claimed above rate*T + capacity');

# An event with a limit and an in-flight cap keyed on the other worker: the
# delegated claim takes from both there, in the same transaction.
my $lim_key = $coord->safe_psql('postgres', sprintf(q{
	SELECT 'acct:' || i FROM generate_series(1, 100) AS i
	JOIN pg_dist_placement p
	  ON p.shardid = get_shard_id_for_distribution_column('ratebucket.buckets', 'acct:' || i)
	JOIN pg_dist_node n USING (groupid)
	WHERE n.nodeport <> %d ORDER BY i LIMIT 1}, owner_port('q:lim')));
$coord->safe_psql('postgres', qq{
SELECT ratebucket.bucket_configure('q:lim', 0.001, 5);
SELECT ratebucket.bucket_configure('$lim_key', 0.001, 2);
SELECT ratebucket.inflight_configure('$lim_key', 3);
INSERT INTO outbox.webhook_events (endpoint, limits, inflight_key)
SELECT 'q:lim', ARRAY['$lim_key'], '$lim_key' FROM generate_series(1, 4);});
is($coord->safe_psql('postgres', q{SELECT count(*) FROM outbox.claim_endpoint('q:lim', 10)}),
	'2', "a claim with a limit on the other worker ($lim_key, 2 tokens) claims 2");
is($coord->safe_psql('postgres', qq{
	SELECT (SELECT tokens_granted FROM ratebucket.buckets WHERE endpoint = 'q:lim') || ' ' ||
	       (SELECT tokens_granted FROM ratebucket.buckets WHERE endpoint = '$lim_key') || ' ' ||
	       (SELECT in_flight FROM ratebucket.inflight_status WHERE key = '$lim_key') || ' ' ||
	       (SELECT count(slot) FROM outbox.webhook_events WHERE endpoint = 'q:lim' AND status = 'sending')}),
	'2 2 2 2', 'both buckets charged 2, 2 slots held by the 2 events');

# record_endpoint, delegated: the outcomes of q:1's claimed events.
my ($ids, $leases) = split /\|/, $coord->safe_psql('postgres', q{
	SELECT array_agg(id ORDER BY id), array_agg(lease_until ORDER BY id)
	FROM outbox.webhook_events WHERE endpoint = 'q:1' AND status = 'sending'});
my $rplan = $coord->safe_psql('postgres', qq{EXPLAIN (VERBOSE, COSTS OFF) SELECT * FROM outbox.record_endpoint('q:1', '$ids', array_fill(200, ARRAY[cardinality('$ids'::bigint[])]), '$leases')});
like($rplan, qr{Task Count: 1}, 'a bare record_endpoint is one task');
my ($n_ok, $n_all) = split /\|/, $coord->safe_psql('postgres', qq{
	SELECT count(*) FILTER (WHERE outcome = 'success'), count(*)
	FROM outbox.record_endpoint('q:1', '$ids', array_fill(200, ARRAY[cardinality('$ids'::bigint[])]), '$leases')});
is($n_ok, $n_all, "record_endpoint on q:1's worker: $n_all outcomes recorded");
is($coord->safe_psql('postgres', q{
	SELECT count(*) FILTER (WHERE status = 'delivered') || ' ' || count(*) FILTER (WHERE status = 'sending')
	FROM outbox.webhook_events WHERE endpoint = 'q:1'}), "$n_all 0", "q:1's claimed events delivered");
like($coord->safe_psql('postgres', q{SELECT string_agg(reason, ',') FROM outbox.explain_endpoint('q:2')}),
	qr{leased}, 'explain_endpoint runs on the worker and says what holds the events');

# ----------------------------- the reference dispatcher, endpoint by endpoint --

# demo/dispatcher --by-endpoint delivers a distributed queue over HTTP to
# demo/simulator's destinations, through the coordinator: 4 destinations
# that accept 40/s in bursts of 20, configured at 20/s in bursts of 5, 40
# events each.  Everything is delivered, nothing twice, every request an
# attempt, no 429, and each destination's arrivals within the bucket's
# rate*T + capacity (+ rate*0.25 s for a batch sent at once).
my $pg_config = $ENV{PG_CONFIG} || 'pg_config';
my ($build_out, $build_err) = run_command([ 'make', '-C', 'demo', "PG_CONFIG=$pg_config" ]);
ok(-x 'demo/dispatcher' && -x 'demo/simulator', 'dispatcher and simulator built')
  or diag($build_err);
my $sim_dir = PostgreSQL::Test::Utils::tempdir();
my $sim_port = PostgreSQL::Test::Cluster::get_free_port();
my @dests = map { "d$_" } 1 .. 4;
my ($d_rate, $d_capacity, $d_events) = (20, 5, 40);
open(my $cfh, '>', "$sim_dir/sim.conf") or die "cannot write sim.conf: $!";
print $cfh "$_ rate=40 burst=20\n" for @dests;
close $cfh;
my $sim = IPC::Run::start(
	[ 'demo/simulator', '--port', $sim_port, '--config', "$sim_dir/sim.conf",
	  '--log', "$sim_dir/requests.csv", '--ready-file', "$sim_dir/ready" ],
	'>', "$sim_dir/sim.out", '2>', "$sim_dir/sim.err");
my $sim_deadline = Time::HiRes::time() + 10;
Time::HiRes::sleep(0.05) until -s "$sim_dir/ready" || Time::HiRes::time() > $sim_deadline;
ok(-s "$sim_dir/ready", 'the simulator is listening');
# its start on CLOCK_MONOTONIC, the clock of the dispatcher's claim log (the
# file goes when the simulator stops)
my $sim_mono_us = (split /\n/, slurp_file("$sim_dir/ready"))[2] // '';
like($sim_mono_us, qr/^\d+$/, "the simulator's ready file gives its start on CLOCK_MONOTONIC");
my $url = "http://127.0.0.1:$sim_port";
# (the claims above are checked: their events go, the dispatcher's queue
# holds only these)
$coord->safe_psql('postgres', 'DELETE FROM outbox.webhook_events');
$coord->safe_psql('postgres', join('', map { qq{
SELECT ratebucket.bucket_configure('$url/$_', $d_rate, $d_capacity);
INSERT INTO outbox.webhook_events (endpoint, payload)
SELECT '$url/$_', jsonb_build_object('n', n) FROM generate_series(1, $d_events) AS n;} } @dests));
my ($disp_out, $disp_err) = ('', '');
IPC::Run::run(
	[ 'demo/dispatcher', '--dsn',
	  sprintf('host=%s port=%d dbname=postgres options=-csearch_path=outbox', $coord->host, $coord->port),
	  '--workers', 4, '--per-endpoint', 5, '--by-endpoint', '--until-empty', '--max-seconds', 60,
	  '--quiet', '--claim-log', "$sim_dir/claims.csv" ],
	'>', \$disp_out, '2>', \$disp_err,
	IPC::Run::timer($PostgreSQL::Test::Utils::timeout_default));
my $disp_rc = $? >> 8;
note("dispatcher:\n$disp_out");
note("dispatcher, stderr:\n$disp_err") if $disp_err ne '';
$sim->signal('TERM');
$sim->finish;
is($disp_rc, 0, 'the dispatcher, endpoint by endpoint, emptied the queue and exited 0');
$coord->safe_psql('postgres', q{
CREATE TABLE sim_requests (t_us bigint, endpoint text, event text, attempt text, status int)});
$coord->safe_psql('postgres', "COPY sim_requests FROM '$sim_dir/requests.csv' WITH (FORMAT csv)");
# When each request's claim was sent (the dispatcher's claim log), on the
# simulator's clock: the claim took the request's token after that, and the
# request arrived after the grant.
$coord->safe_psql('postgres', q{
CREATE TABLE sim_claims (event text, attempt text, claim_us bigint)});
$coord->safe_psql('postgres', "COPY sim_claims FROM '$sim_dir/claims.csv' WITH (FORMAT csv)");
$coord->safe_psql('postgres', "UPDATE sim_claims SET claim_us = claim_us - $sim_mono_us");
my $n_events = scalar(@dests) * $d_events;
is($coord->safe_psql('postgres', qq{
	SELECT count(*) FROM outbox.webhook_events
	WHERE endpoint LIKE '$url/%' AND status = 'delivered'}),
	$n_events, "every one of the $n_events events delivered");
is($coord->safe_psql('postgres', q{
	SELECT count(*) FROM (SELECT event FROM sim_requests WHERE status BETWEEN 200 AND 299
	                      GROUP BY event HAVING count(*) > 1) AS x}),
	'0', 'none delivered twice (no event with two 2xx at its destination)');
is($coord->safe_psql('postgres', qq{
	SELECT (SELECT count(*) FROM sim_requests) || ' ' ||
	       (SELECT sum(attempts) FROM outbox.webhook_events WHERE endpoint LIKE '$url/%')
	       || ' ' || (SELECT count(*) FROM sim_requests WHERE status = 429)}),
	"$n_events $n_events 0", 'one request per event, each counted as an attempt, no 429');
for my $d (@dests)
{
	my ($excess, undef, $n) = window_excess($coord,
		"(SELECT to_timestamp(t_us / 1e6) AS at FROM sim_requests WHERE endpoint = '$d') AS r", $d_rate);
	# the longest from a claim sent to its request's arrival (an event
	# claimed again with the same attempt: its latest claim before then);
	# NULL if a request has no claim
	my $delay = $coord->safe_psql('postgres', qq{
		SELECT CASE WHEN bool_and(d IS NOT NULL) THEN max(d) END
		FROM (SELECT (r.t_us - max(c.claim_us) FILTER (WHERE c.claim_us <= r.t_us)) / 1e6 AS d
		      FROM sim_requests r
		      LEFT JOIN sim_claims c ON c.event = r.event AND c.attempt = r.attempt
		      WHERE r.endpoint = '$d'
		      GROUP BY r.t_us, r.event, r.attempt) AS x});
	ok($n == $d_events && $delay ne '' && $excess <= $d_capacity + $d_rate * $delay,
		"$d: its $d_events events arrived ($n), over any window T within rate*(T + d) + capacity,"
		  . sprintf(" d the longest from a claim to its request's arrival (%.3f s): excess %.1f",
			$delay eq '' ? 'NaN' : $delay, $excess));
}

# ------------------------------------------------------------------- load --

# 8 clients over 200 endpoints, each at 50/s in bursts of 10, through the
# coordinator; a client that was granted a take records it (in a second
# statement, on the coordinator).  Demand is far above the rates.
my ($rate, $capacity, $endpoints) = (50, 10, 200);
$coord->safe_psql('postgres', 'CREATE TABLE grants (endpoint text NOT NULL)');
$coord->pgbench(
	"-n -c 8 -j 2 -T 5",
	0,
	[ qr{number of failed transactions: 0 \(0\.000%\)} ],
	[ qr{^$} ],
	'8 clients over 200 endpoints through the coordinator: no failed transaction',
	{
		'014_citus_take' => qq{
\\set e random(1, $endpoints)
SELECT allowed AS granted FROM ratebucket.bucket_take('load:' || :e, $rate, $capacity) \\gset
\\if :granted
INSERT INTO grants VALUES ('load:' || :e);
\\endif
},
	});
my ($n_endpoints, $seen, $counted, $over) = split /\|/, $coord->safe_psql('postgres', qq{
WITH g AS (SELECT endpoint, count(*) AS n FROM grants GROUP BY endpoint),
     b AS (SELECT endpoint, takes_granted,
                  $rate * extract(epoch FROM last_granted_at - created_at) + $capacity AS bound
           FROM ratebucket.buckets WHERE endpoint LIKE 'load:%')
SELECT count(*), sum(g.n), sum(b.takes_granted),
       count(*) FILTER (WHERE b.takes_granted > b.bound + 1e-6 OR g.n IS DISTINCT FROM b.takes_granted)
FROM b FULL JOIN g USING (endpoint)});
note("endpoints $n_endpoints, grants seen by the clients $seen, counted by the rows $counted");
is($n_endpoints, $endpoints, "every endpoint taken from ($n_endpoints)");
is($seen, $counted, 'the grants the clients saw are the grants the rows counted');
is($over, '0', "no endpoint above rate*T + capacity by its own clock, none miscounted ($over)");
# The load was spread over both workers: each holds some of the endpoints.
for my $w (@workers)
{
	my $held = $coord->safe_psql('postgres', sprintf(q{
		SELECT count(*) FROM generate_series(1, %d) AS i
		JOIN pg_dist_placement p
		  ON p.shardid = get_shard_id_for_distribution_column('ratebucket.buckets', 'load:' || i)
		JOIN pg_dist_node n USING (groupid)
		WHERE n.nodeport = %d}, $endpoints, $w->port));
	ok($held > 0 && $held < $endpoints, $w->name . " holds $held of the $endpoints endpoints");
}

# --------------------------------------------- a worker killed mid-load --

# pgbench through the coordinator, in the background, over endpoints of
# both workers; the script of the load above, recording into a table of
# its own.  Returns the IPC::Run handle and refs to its output.
sub start_load
{
	my ($prefix, $table, $seconds) = @_;
	my $script = $coord->basedir . "/014_$prefix.sql";
	open(my $fh, '>', $script) or die "cannot write $script: $!";
	print $fh qq{\\set e random(1, $endpoints)
SELECT allowed AS granted FROM ratebucket.bucket_take('$prefix:' || :e, $rate, $capacity) \\gset
\\if :granted
INSERT INTO $table VALUES ('$prefix:' || :e);
\\endif
};
	close $fh;
	my ($out, $err) = ('', '');
	my $h = IPC::Run::start(
		[ 'pgbench', '-n', '-c', 8, '-j', 2, '-T', $seconds, '-f', $script,
		  '-h', $coord->host, '-p', $coord->port, 'postgres' ],
		'<', \undef, '>', \$out, '2>', \$err,
		IPC::Run::timer($PostgreSQL::Test::Utils::timeout_default));
	return ($h, \$out, \$err);
}

# Per endpoint of $prefix: how many rows, the grants the clients saw, the
# grants the rows counted, endpoints whose row counted fewer grants than
# its clients saw (a committed take lost), and endpoints above the bound.
sub load_figures
{
	my ($prefix, $table) = @_;
	return split /\|/, $coord->safe_psql('postgres', qq{
WITH g AS (SELECT endpoint, count(*) AS n FROM $table GROUP BY endpoint),
     b AS (SELECT endpoint, takes_granted,
                  $rate * extract(epoch FROM last_granted_at - created_at) + $capacity AS bound
           FROM ratebucket.buckets WHERE endpoint LIKE '$prefix:%')
SELECT count(*), coalesce(sum(g.n), 0), coalesce(sum(b.takes_granted), 0),
       count(*) FILTER (WHERE coalesce(b.takes_granted, 0) < coalesce(g.n, 0)),
       count(*) FILTER (WHERE b.takes_granted > b.bound + 1e-6)
FROM b FULL JOIN g USING (endpoint)});
}

$coord->safe_psql('postgres', 'CREATE TABLE grants_crash (endpoint text NOT NULL)');
my ($crash_load, $crash_out, $crash_err) = start_load('crash', 'grants_crash', 30);
Time::HiRes::sleep(2);
my $before_kill = $coord->safe_psql('postgres', 'SELECT count(*) FROM grants_crash');
cmp_ok($before_kill, '>', 0, "load running through the coordinator ($before_kill grants so far)");
my $victim = $workers[0];
my $kill = kill_server($victim);
note(sprintf('%s killed (SIGKILL to the postmaster and its %d children)',
		$victim->name, scalar @{ $kill->{children} }));
$crash_load->finish;
note("pgbench, stderr (first lines):\n"
	  . join("\n", grep { defined } (split /\n/, $$crash_err)[0 .. 3]));
like($$crash_err, qr/connection|terminat|abort|lost/i,
	'the clients whose takes went to the killed worker saw it die');
$victim->start;
ok($victim->log_contains(qr/database system was interrupted|not properly shut down/),
	$victim->name . ' restarted with crash recovery');
my ($c_rows, $c_seen, $c_counted, $c_lost, $c_over) = load_figures('crash', 'grants_crash');
note("after the crash: $c_rows endpoints, grants seen by the clients $c_seen, counted by the rows $c_counted");
is($c_lost, '0', "no endpoint lost a take its client saw committed ($c_seen seen, $c_counted counted)");
is($c_over, '0', 'no endpoint above rate*T + capacity after the crash');
# The restarted worker serves takes again, through the coordinator.
my $on_victim = $coord->safe_psql('postgres', sprintf(q{
	SELECT 'crash:' || i FROM generate_series(1, %d) AS i
	JOIN pg_dist_placement p
	  ON p.shardid = get_shard_id_for_distribution_column('ratebucket.buckets', 'crash:' || i)
	JOIN pg_dist_node n USING (groupid)
	WHERE n.nodeport = %d LIMIT 1}, $endpoints, $victim->port));
is($coord->safe_psql('postgres', qq{SELECT count(*) FROM ratebucket.bucket_take('$on_victim', 0.001, 5)}),
	'1', "a take of $on_victim, held by the restarted worker");

# ---------------------------------------------- a shard moved under load --

# citus_move_shard_placement moves a shard of the buckets (and the shards
# co-located with it) from one worker to the other while 8 clients take
# through the coordinator, some of them from endpoints of that shard.
my ($move_shard, $move_from) = split /\|/, $coord->safe_psql('postgres', sprintf(q{
	SELECT p.shardid, n.nodeport FROM generate_series(1, %d) AS i
	JOIN pg_dist_placement p
	  ON p.shardid = get_shard_id_for_distribution_column('ratebucket.buckets', 'move:' || i)
	JOIN pg_dist_node n USING (groupid)
	GROUP BY 1, 2 ORDER BY count(*) DESC, 1 LIMIT 1}, $endpoints));
my ($from_node) = grep { $_->port == $move_from } @workers;
my ($to_node) = grep { $_->port != $move_from } @workers;
$coord->safe_psql('postgres', 'CREATE TABLE grants_move (endpoint text NOT NULL)');
my ($move_load, $move_out, $move_err) = start_load('move', 'grants_move', 5);
Time::HiRes::sleep(1.5);
$coord->safe_psql('postgres', sprintf(q{
	SELECT citus_move_shard_placement(%d, '%s', %d, '%s', %d, shard_transfer_mode => 'block_writes')},
	$move_shard, $from_node->host, $from_node->port, $to_node->host, $to_node->port));
my $moved_at = $coord->safe_psql('postgres', 'SELECT clock_timestamp()');
$move_load->pump_nb;
ok($move_load->pumpable, 'the load was still running when the move ended');
my $move_ok = $move_load->finish;
my ($move_failed) = $$move_out =~ /number of failed transactions: (\d+)/;
note("pgbench during the move: " . join(' ', grep { /transactions|failed|tps/ } split /\n/, $$move_out));
is($coord->safe_psql('postgres', "SELECT n.nodeport FROM pg_dist_placement p JOIN pg_dist_node n USING (groupid) WHERE p.shardid = $move_shard"),
	$to_node->port, "shard $move_shard moved from " . $from_node->name . ' to ' . $to_node->name . ' during the load');
# (An aborted client is not a "failed transaction" to pgbench: the exit
# status and stderr say so.  Before the shard lock of the takes, every
# client aborted: "bucket row to update was not found at its locked
# position", the row locked in the old placement, updated in the new.)
ok($move_ok && ($move_failed // 'none') eq '0' && $$move_err !~ /abort|error/i,
	'no client transaction failed or aborted during the move')
  or diag("pgbench exit " . ($? >> 8) . ", stderr:\n$$move_err");
my ($m_rows, $m_seen, $m_counted, $m_lost, $m_over) = load_figures('move', 'grants_move');
note("the move: $m_rows endpoints, grants seen by the clients $m_seen, counted by the rows $m_counted");
is("$m_lost $m_seen", "0 $m_counted", 'every grant the clients saw is counted by its row, after the move');
is($m_over, '0', 'no endpoint above rate*T + capacity across the move');
cmp_ok($coord->safe_psql('postgres', qq{
	SELECT count(*) FROM ratebucket.buckets
	WHERE endpoint LIKE 'move:%' AND last_granted_at > '$moved_at'
	  AND get_shard_id_for_distribution_column('ratebucket.buckets', endpoint) = $move_shard}),
	'>', 0, "endpoints of shard $move_shard were granted takes on " . $to_node->name . ' after the move');

$_->stop for reverse @nodes;
done_testing();
