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
#     all or nothing; templates configuring an endpoint on its worker;
#   - 8 clients over 200 endpoints through the coordinator: 0 failed
#     transactions; per endpoint, the grants the clients saw = the row's
#     takes_granted <= rate*T + capacity by the row's own clock.
#
# Skipped, saying so, where Citus is not installed (build it with
# ../shared/citus/build-citus, or let ./test/run do it: see
# doc/guarantees.md).

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use lib 'test/perl';
use RatebucketTest;

my $probe = PostgreSQL::Test::Cluster->new('probe');
my $libdir = $probe->config_data('--pkglibdir');
plan skip_all => "Citus is not installed ($libdir/citus.so is missing): "
  . 'build it with ../shared/citus/build-citus'
  unless -e "$libdir/citus.so";

# ------------------------------------------------------------ the cluster --

my $conf = q{
shared_preload_libraries = 'citus'
max_connections = 100
max_prepared_transactions = 100
citus.shard_count = 8
wal_level = logical
};
my @nodes = map { new_node($_, conf => $conf) } qw(coordinator worker1 worker2);
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

my $did = $coord->safe_psql('postgres',
	q{SELECT string_agg(object || ': ' || action, E'\n' ORDER BY object) FROM ratebucket.distribute()});
note($did);
like($did, qr{^ratebucket\.buckets: distributed by endpoint$}m, 'buckets distributed by endpoint');
like($did, qr{^ratebucket\.bucket_take\(text,double precision,double precision,double precision\): delegated}m,
	'the explicit take delegated');
my $again = $coord->safe_psql('postgres',
	q{SELECT count(*) FILTER (WHERE action LIKE 'already%') || ' of ' || count(*) FROM ratebucket.distribute()});
like($again, qr{^(\d+) of \1$}, "distribute() again changes nothing ($again already so)");

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

$_->stop for reverse @nodes;
done_testing();
