# 013_striped.pl — one hot endpoint, striped (bucket_stripe), under
# saturating demand from many clients.
#
# The endpoint allows 400/s (burst 40), striped over 8 rows of 50/s (burst
# 5).  24 pgbench clients take one token at a time for 5 s, far more than
# 400/s; 1 take in 7 rolls back, and some sessions report successes
# (bucket_observe) meanwhile.  Every grant is recorded in the same
# transaction as the take.  Checked:
#
#   Bound, exactly       the stripes' own counters, summed, equal the grants
#                        recorded, and are at most 400*T + 40, T from the
#                        striping to the last grant; each stripe's at most
#                        50*T + 5 by its own clock.
#   Every window         between any two recorded grants, at most 40 above
#                        400/s (the recorded time is the insert's, a little
#                        after the take's clock: 1 token of slack, 400 * 2.5 ms).
#   Efficiency           at least 95% of the bound is granted: no token is
#                        stranded on a stripe while takers are refused.
#   Rollback             takes that roll back give their tokens back (the
#                        counters above would exceed the recorded grants).
#   Spread               every stripe grants: no stripe is left idle.
#   No deadlock, error   pgbench reports no failed transaction.
#   Dump and restore     pg_dump / pg_restore carry the striping, the stripes
#                        and their counters; the restored endpoint takes.
#   Restriping           then 12 clients take from another endpoint that a
#                        13th restripes every 50 ms (1 to 8 stripes): the
#                        counters still equal the recorded grants, and the
#                        bound holds overall and over every window.
#
# It also prints the take throughput with and without stripes, for the
# record (not checked: the machine is shared).

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use lib 'test/perl';
use RatebucketTest;

my $node = start_node('striped', conf => "max_connections = 40\nsynchronous_commit = off\n");

my ($rate, $capacity, $stripes, $clients, $seconds) = (400, 40, 8, 24, 5);

$node->safe_psql('postgres', qq{
SELECT ratebucket.bucket_configure('hot', $rate, $capacity);
SELECT ratebucket.bucket_stripe('hot', $stripes);
CREATE TABLE grants (at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE SEQUENCE rolled_back;
});

$node->pgbench(
	"-n -M prepared -c $clients -j 2 -T $seconds",
	0,
	[ qr{number of failed transactions: 0 \(0\.000%\)} ],
	[ qr{^$} ],
	"$clients clients saturate one endpoint striped over $stripes: no error, no deadlock",
	{
		'001_take@12' => q{
INSERT INTO grants SELECT FROM ratebucket.bucket_take('hot') WHERE allowed;
},
		'002_take_rollback@2' => q{
BEGIN;
SELECT nextval('rolled_back') FROM ratebucket.bucket_take('hot') WHERE allowed;
ROLLBACK;
},
		'003_observe@1' => q{
SELECT outcome FROM ratebucket.bucket_observe('hot', 200);
},
	},
	'postgres');

my ($recorded, $granted, $takes, $t, $busy, $per_stripe_ok, $stripes_used, $successes) =
  query_row($node, qq{
WITH s AS (
  SELECT st.*
  FROM generate_series(0, $stripes - 1) AS i
  JOIN ratebucket.buckets AS st ON st.endpoint = ratebucket.stripe_key('hot', i, $stripes))
SELECT (SELECT count(*) FROM grants),
       (SELECT sum(tokens_granted) FROM s),
       (SELECT sum(takes_granted) FROM s),
       (SELECT extract(epoch FROM max(s.last_granted_at) - r.striped_at)
        FROM s, ratebucket.bucket_stripes r WHERE r.endpoint = 'hot' GROUP BY r.striped_at),
       (SELECT extract(epoch FROM max(s.last_granted_at) - (SELECT min(at) FROM grants)) FROM s),
       (SELECT bool_and(s.tokens_granted <= s.conf_rate * extract(epoch FROM s.last_granted_at - s.created_at)
                                           + s.conf_capacity + 1e-9) FROM s),
       (SELECT count(*) FILTER (WHERE takes_granted > 0) FROM s),
       (SELECT successes FROM ratebucket.bucket_status WHERE endpoint = 'hot')});
my $bound = $rate * $t + $capacity;

is($granted, $recorded, "the stripes' counters = the grants recorded ($recorded): rolled-back takes gave their tokens back");
is($takes, $recorded, 'one take per grant');
ok($recorded <= $bound + 1e-6,
	sprintf('%d grants within %d*T + %d = %.1f (T = %.3f s)', $recorded, $rate, $capacity, $bound, $t));
is($per_stripe_ok, 't', sprintf('each stripe within %g*T + %g by its own clock', $rate / $stripes,
	$capacity / $stripes));
# Efficiency over the time the clients were taking (from the first grant):
# the bucket starts full, and fills up to its capacity only while pgbench
# connects.
my $busy_bound = $rate * $busy + $capacity;
ok($recorded >= 0.95 * $busy_bound,
	sprintf('efficiency %.1f%% >= 95%% under saturating demand (%d of %.1f over %.3f s)',
		100 * $recorded / $busy_bound, $recorded, $busy_bound, $busy));
is($stripes_used, $stripes, 'every stripe granted');
ok($node->safe_psql('postgres', 'SELECT is_called FROM rolled_back') eq 't',
	'some takes rolled back');
ok($successes > 0, "observes ran meanwhile ($successes successes)");

my ($excess, undef, $n) = window_excess($node, 'grants', $rate);
ok($excess <= $capacity + 1 + 1e-6,
	sprintf('every window: at most %.2f grants above %d/s (capacity %d, 1 of slack)',
		$excess, $rate, $capacity));

# Dump and restore: striping is configuration (pg_extension_config_dump of
# ratebucket.bucket_stripes, and the stripes are configured rows).
my $dump = $node->basedir . '/striped.dump';
$node->command_ok([ 'pg_dump', '-Fc', '--no-sync', '-f', $dump, '-d', 'postgres' ],
	'pg_dump of a database with a striped endpoint');
$node->safe_psql('postgres', 'CREATE DATABASE restored');
$node->command_ok(
	[ 'pg_restore', '--exit-on-error', '--single-transaction', '-d', 'restored', $dump ],
	'pg_restore into a new database');
my $status_sql = q{
SELECT s.stripes || ' ' || s.takes_granted || ' '
       || (SELECT count(*) FROM ratebucket.buckets WHERE octet_length(endpoint) > 1024)
FROM ratebucket.bucket_status s WHERE s.endpoint = 'hot'};
is($node->safe_psql('restored', $status_sql), $node->safe_psql('postgres', $status_sql),
	'restored: the endpoint is striped as before, with its stripes and their counters');
is($node->safe_psql('restored', q{SELECT allowed FROM ratebucket.bucket_take('hot')}),
	't', 'restored: a take of the striped endpoint is granted');

# Restriping under load: 12 clients take from an endpoint (300/s, burst
# 30) that another client restripes every 50 ms (2 to 8 stripes, or back to
# one row).  bucket_stripe moves the tokens the bucket holds, so the bound
# holds across every change, from the configuration on; the counters of old
# stripes are folded into the endpoint's row, so the status view's
# tokens_granted still counts every grant.  A take that meets a restripe
# between reading the stripe count and reading the stripes may be asked to
# retry (a serialization failure): pgbench retries it.
$node->safe_psql('postgres', q{
CREATE TABLE moving_grants (at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE TABLE restripes (stripes_before int NOT NULL);
SELECT ratebucket.bucket_configure('moving', 300, 30);
SELECT ratebucket.bucket_stripe('moving', 4);
});
$node->pgbench(
	"-n -M prepared -c 13 -j 2 -T 3 --max-tries=10",
	0,
	[ qr{number of failed transactions: 0 \(0\.000%\)} ],
	[ qr{^$} ],
	'12 clients take while another restripes every 50 ms: no error, no deadlock',
	{
		'011_moving_take@12' => q{
INSERT INTO moving_grants SELECT FROM ratebucket.bucket_take('moving') WHERE allowed;
},
		'012_restripe@1' => q{
INSERT INTO restripes SELECT ratebucket.bucket_stripe('moving', (random() * 7)::int + 1);
\sleep 50 ms
},
	},
	'postgres');
my ($m_recorded, $m_counted, $m_t, $m_busy, $m_restripes) = query_row($node, q{
SELECT (SELECT count(*) FROM moving_grants), s.tokens_granted,
       extract(epoch FROM s.last_used - s.configured_at),
       extract(epoch FROM s.last_used - (SELECT min(at) FROM moving_grants)),
       (SELECT count(DISTINCT stripes_before) FROM restripes)
FROM ratebucket.bucket_status s WHERE s.endpoint = 'moving'});
ok($m_restripes >= 5, "the endpoint was restriped to and from $m_restripes different stripe counts");
my $m_bound = 300 * $m_t + 30;
is($m_counted, $m_recorded, "restriped: the counters = the grants recorded ($m_recorded)");
ok($m_recorded <= $m_bound + 1e-6,
	sprintf('restriped: %d grants within 300*T + 30 = %.1f', $m_recorded, $m_bound));
my ($m_excess) = window_excess($node, 'moving_grants', 300);
ok($m_excess <= 30 + 1 + 1e-6,
	sprintf('restriped, every window: at most %.2f grants above 300/s (capacity 30, 1 of slack)',
		$m_excess));
note(sprintf('restriped every 50 ms: %d grants, %.1f%% of 300*T + 30 over the %.2f s of takes',
	$m_recorded, 100 * $m_recorded / (300 * $m_busy + 30), $m_busy));

# Throughput, for the record: every take granted (huge limits), one hot
# endpoint, unstriped and striped, the same clients.
$node->safe_psql('postgres', qq{
SELECT ratebucket.bucket_configure('flat', 1e9, 1e9);
SELECT ratebucket.bucket_configure('wide', 1e9, 1e9);
SELECT ratebucket.bucket_stripe('wide', 16);
});
my %tps;
for my $ep ('flat', 'wide')
{
	my ($ret, $out, $err) = $node->psql('postgres', 'SELECT 1');    # warm the cache
	my @cmd = ('pgbench', '-n', '-M', 'prepared', '-c', $clients, '-j', 2, '-T', 2,
		'-h', $node->host, '-p', $node->port,
		'-f', '-', 'postgres');
	my ($stdout, $stderr);
	IPC::Run::run(\@cmd, '<', \"SELECT allowed FROM ratebucket.bucket_take('$ep');\n",
		'>', \$stdout, '2>', \$stderr);
	($tps{$ep}) = $stdout =~ /tps = ([\d.]+)/;
	$tps{$ep} //= 0;
}
note(sprintf('one hot endpoint, %d clients, every take granted: %.0f takes/s unstriped, '
	  . '%.0f striped over 16 (%.2fx)', $clients, $tps{flat}, $tps{wide},
	$tps{flat} > 0 ? $tps{wide} / $tps{flat} : 0));
note(sprintf('saturated run: %d grants of %.1f possible over %.2f s', $recorded, $bound, $t));

$node->stop;
done_testing();
