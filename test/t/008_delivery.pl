# 008_delivery.pl — end to end: the demo's scenario, shorter, over real HTTP.
#
# demo/scenario on a server of this test's own: seventeen destinations
# played by demo/simulator (each with its own limiter; eight accept less
# than ratebucket is configured with: 429s with Retry-After in seconds, as
# an HTTP-date, as RateLimit headers, or with no header at all, a limit that
# halves and comes back during the run, a pacer with no burst, windows of
# 10 s that count refused requests too; besides, 5xx,
# an endpoint unreachable for 10 s, a slow one), the reference dispatcher
# (demo/dispatcher.c, 8 workers) delivering the queue of ratebucket_queue until
# it is empty.  The assertions come from the simulator's own log of every
# request it received, loaded into sim_requests, and from ratebucket's
# buckets, and are computed by demo/report.sql (the same checks the demo
# prints); each becomes one test here.  Checks 6 to 10 are about the six
# destinations configured above their true limit, each with its figures:
#
#   1. every event delivered, but those the spent quota holds for tomorrow;
#   2. none delivered twice (no event id with two 2xx at the destination);
#   3. attempts = requests the destinations received (a refusal by a bucket
#      never costs an attempt; a connection refused is not a request);
#   4. no 429 from destinations whose true limit is at or above the
#      configured one;
#   5. per destination, arrivals over any window T within
#      rate*(T + d) + capacity, d the longest time from the claim that took a
#      request's tokens (the dispatcher's --claim-log) to its arrival: the
#      grants the limiter bounds by rate*T + capacity lie between the two;
#   6. over the second half of its delivery, each delivered (2xx arrivals
#      per second) at least 0.8 x its true limit (for the one whose limit
#      changes, its mean then, leaving out the 15 s after each change,
#      which check 10 judges);

#   7. 429s later than 10 s after its first request (and, for the changing
#      one, than 15 s after each change) at most 1 % of its requests;
#   8. its effective rate over the second half of its delivery (the median
#      of the samples) within 0.8-1.1 x its true limit (the last one);
#   9. its last event delivered within the time its events take at 0.8 x
#      its true limit (as it changes), + 10 s, from its first request;
#  10. after each change of limit: 429s later than 15 s after it at most 1 %
#      of that phase's requests, and from then to the next change (or the
#      end) at least 0.8 x that phase's limit delivered per second, a
#      stretch of at least 3 s (DEMO_SCALE does not shorten a phase below
#      20 s, so it is measured over 5 s at least; why 15 s: demo/report.sql);
#  11. the unreachable destination tripped its breaker, then got everything;
#  12. two endpoints sharing an account's rate (their events' limits): their
#      arrivals together, over any window T, within the account's
#      rate*(T + d) + capacity (d as in 5), less than their own two allow;
#  13. two endpoints sharing a daily quota of three quarters of their events:
#      never more requests than the quota (per UTC day the run touched), and
#      it ran out: the rest wait, pending, for its reset at midnight UTC
#      (check 1 counts them as held, not lost).
#
# With gnuplot installed (gnuplot-nox: .ci/run installs it), the scenario
# also draws demo/plot's PNG into this test's temp dir, and a test checks
# that a PNG came out.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use lib 'test/perl';
use RatebucketTest;

# The dispatcher and the simulator, built against this PostgreSQL's libpq.
my $pg_config = $ENV{PG_CONFIG} || 'pg_config';
my ($build_out, $build_err) = run_command(
	[ 'make', '-C', 'demo', "PG_CONFIG=$pg_config" ]);
ok(-x 'demo/dispatcher' && -x 'demo/simulator', 'dispatcher and simulator built')
  or BAIL_OUT("make -C demo failed: $build_err");

# No extension yet: demo/scenario creates it, as a user would.
my $node = new_node('delivery', conf => "max_connections = 40\nautovacuum_naptime = 2s\n");
$node->start;

my $work = PostgreSQL::Test::Utils::tempdir();
my $sim_port = PostgreSQL::Test::Cluster::get_free_port();
my $have_gnuplot = system('command -v gnuplot >/dev/null 2>&1') == 0;
my $plot = "$work/ratebucket-demo.png";

my ($stdout, $stderr);
{
	local %ENV = (%ENV,
		PGHOST => $node->host,
		PGPORT => $node->port,
		PGDATABASE => 'postgres',
		DEMO_SCALE => '0.3',
		DEMO_MAX_SECONDS => '120',
		DEMO_PLOT => ($have_gnuplot ? $plot : 'none'),
		SIM_PORT => $sim_port);
	delete $ENV{PGUSER};
	IPC::Run::run([ 'demo/scenario', 'demo', $work ],
		'>', \$stdout, '2>', \$stderr);
}
my $rc = $? >> 8;
note($stdout);
note($stderr) if $stderr ne '';

# The checks, one test each, whatever the scenario's own exit status said.
my $checks = $node->safe_psql('postgres',
	q{SELECT n || '|' || CASE WHEN ok THEN 't' ELSE 'f' END || '|' || name || '|' || detail
	  FROM demo_checks ORDER BY n});
my @rows = split /\n/, $checks;
is(scalar @rows, 13, 'the report made its thirteen checks');
for my $row (@rows)
{
	my ($n, $ok, $name, $detail) = split /\|/, $row, 4;
	ok($ok eq 't', "$name: $detail");
}
is($rc, 0, 'demo/scenario exited 0 (the dispatcher finished, every check held)');

# The simulator saw traffic on every endpoint, and 429s where limits were
# configured too high (otherwise checks 4 and 6 to 10 would be vacuous).
is($node->safe_psql('postgres', q{
SELECT count(DISTINCT endpoint) FROM sim_requests WHERE status BETWEEN 200 AND 299}),
	$node->safe_psql('postgres', 'SELECT count(*) FROM demo_endpoints'),
	'every destination received deliveries');
ok($node->safe_psql('postgres', q{
SELECT count(*) FROM sim_requests r JOIN demo_endpoints d ON d.name = r.endpoint
WHERE r.status = 429 AND d.true_rate < d.rate}) > 0,
	'destinations configured above their limit did answer 429 (so convergence was tested)');
# The sampler ran through the delivery: ratebucket's rates over time, for the plot.
ok($node->safe_psql('postgres', q{
SELECT count(DISTINCT s.t) FROM demo_samples s JOIN demo_endpoints d ON d.url = s.endpoint
WHERE d.name = 'shifting'}) >= 20,
	'the effective rates were sampled during the delivery');

SKIP:
{
	skip 'gnuplot is not installed (gnuplot-nox): no plot drawn', 1 unless $have_gnuplot;
	my $png = '';
	if (open(my $fh, '<:raw', $plot))
	{
		read($fh, $png, 8);
		close($fh);
	}
	ok(-s $plot && $png eq "\x89PNG\r\n\x1a\n", "demo/plot drew a PNG ($plot, " . (-s $plot // 0) . ' bytes)');
}

$node->stop;
done_testing();
