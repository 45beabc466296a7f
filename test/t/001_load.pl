# 001_load.pl — multi-client load check of the DESIGN invariants.
#
# pgbench hammers two buckets from 8 clients for a few seconds, with demand
# far above their rates, and every granted take inserts a row in "grants" in
# the same transaction as the take.  Then, per bucket:
#
#   Bound (invariant 1)       count(grants) = takes_granted, and
#                             takes_granted <= rate*T + capacity, with T the
#                             bucket's own clock from creation (full, at the
#                             first take) to its last grant; and for the
#                             recorded grant times, over every pair of grants
#                             i < j:  j - i <= rate*(t_j - t_i) + capacity.
#   Efficiency (invariant 2)  takes_granted >= 95% of rate*T + capacity.
#   Transactional (inv. 3)    a third script takes from the hot bucket and
#                             rolls back.  Its grants are counted by a
#                             sequence (non-transactional), so we know they
#                             happened; they must not appear in takes_granted
#                             and, since their tokens come back, must not cost
#                             the committed takers any efficiency.
#
# Why the sliding-window check holds (and is not looser than it must be):
# let c_k be the clock the k-th granted take read under the row lock, g_k the
# clock_timestamp() of its grants row (read later, in the same transaction,
# still under the lock) and b_k the tokens left after it.  Take k+1 gets the
# lock only after take k committed, so c_k <= g_k <= c_{k+1}: sorting grants
# by g is their commit order.  Between grants the bucket only refills, so
# b_j <= b_{i+1} + rate*(c_j - c_{i+1}) - (j - i - 1), with b_j >= 0 and
# b_{i+1} <= capacity - 1; and c_j - c_{i+1} <= g_j - g_i.  Hence
#     j - i <= capacity + rate*(g_j - g_i)
# i.e. the grants in the half-open window (g_i, g_j] are bounded.  (Counting
# grant i too is NOT implied: c_i may precede g_i.)  The check counts grants
# by time, so ties in g (not expected at microsecond resolution) are safe.
#
# Figures are printed with note() for the record: run prove with -v to see
# them (they are also in tmp_check/log/regress_log_001_load).

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes ();

use lib 'test/perl';
use RatebucketTest;

my $t_start = Time::HiRes::time();

# ------------------------------------------------------------------ setup --

# Demand: 8 clients, 2 threads, 5 seconds.  Every statement is tiny, so
# demand is thousands of takes per second on each bucket, several times its
# rate (checked, not assumed: see "demand saturates").
my $clients  = 8;
my $threads  = 2;
my $duration = 5;

# The buckets.  "hot": every client hammers it, and 2 in 5 of its takes roll
# back.  "warm": a higher rate and burst, taken in a multi-statement
# transaction (take, then insert, with a round trip in between).
my %bucket = (
	hot  => { rate => 200,  capacity => 50 },
	warm => { rate => 400, capacity => 100 },);

my $efficiency_min = 0.95;
# Demand (takes attempted per second) must be at least this multiple of the
# rate, or the efficiency check would measure the load, not the limiter.
# Measured here (2 cores): about 14x for warm, 29x for hot; with a
# benchmark competing for the CPU, warm's demand fell to 1,531 takes/s,
# which is why its rate is 400/s and not more.  Below 2x the run fails and
# says why.
my $saturation_min = 2;

# Connections: the clients, psql, and room.
my $node = start_node('load', conf => "max_connections = 30\n");

$node->safe_psql('postgres', q{
CREATE TABLE grants (
	endpoint text NOT NULL,
	at timestamptz NOT NULL DEFAULT clock_timestamp()
);
-- Counts grants that were then rolled back: nextval() survives a rollback.
CREATE SEQUENCE rolled_back_grants;
});

# --------------------------------------------------------------- pgbench --

# Scripts are run in the order of their names (Cluster.pm sorts them), so
# pgbench numbers them 0, 1, 2 in this order.  The weights set each script's
# share of transactions.
my @scripts = (
	{
		name   => '001_hot_commit',
		weight => 3,
		bucket => 'hot',
		# one statement, one transaction: take, and record the grant
		sql => q{
INSERT INTO grants(endpoint)
SELECT :hot_ep::text FROM ratebucket.bucket_take(:hot_ep, :hot_rate, :hot_cap)
WHERE allowed;
},
	},
	{
		name   => '002_hot_rollback',
		weight => 2,
		bucket => 'hot',
		# take, count a grant outside the transaction, give it back
		sql => q{
BEGIN;
SELECT nextval('rolled_back_grants')
FROM ratebucket.bucket_take(:hot_ep, :hot_rate, :hot_cap)
WHERE allowed;
ROLLBACK;
},
	},
	{
		name   => '003_warm_commit',
		weight => 5,
		bucket => 'warm',
		# a worker-like transaction: take, look at the answer, act on it
		sql => q{
BEGIN;
SELECT allowed FROM ratebucket.bucket_take(:warm_ep, :warm_rate, :warm_cap) \gset
\if :allowed
INSERT INTO grants(endpoint) VALUES (:warm_ep);
\endif
COMMIT;
},
	},);

my %files = map { ("$_->{name}\@$_->{weight}" => $_->{sql}) } @scripts;
my $log_prefix = $node->basedir . '/pgbench_load';
my @defines = bucket_defines(\%bucket);

my $t_bench = Time::HiRes::time();
$node->pgbench(
	"-n -M prepared -c $clients -j $threads -T $duration "
	  . "-l --log-prefix=$log_prefix "
	  . join(' ', @defines),
	0,
	[
		qr{number of transactions actually processed: [1-9]\d*},
		qr{number of failed transactions: 0 \(0\.000%\)},
		qr{SQL script 3: \S+003_warm_commit}
	],
	[qr{^$}],
	'pgbench: 8 clients saturate two buckets, with rollbacks',
	\%files,
	'postgres');
$t_bench = Time::HiRes::time() - $t_bench;

# Per-transaction logs, one per thread: transactions per script, and the
# span from the first start to the last end.
my $stats      = pgbench_log_stats($log_prefix, scalar @scripts);
my @per_script = @{ $stats->{per_script} };
my $logs       = $stats->{logs};
ok($logs == $threads, "pgbench wrote one transaction log per thread ($logs)");
my $xacts = 0;
$xacts += $_ for @per_script;
my $span = $stats->{last_end} - $stats->{first_start};
my $tps  = $xacts / $span;
note(sprintf('pgbench: %d clients, %d threads, -T %d: %d transactions in %.3f s = %.0f tps (pgbench wall time %.1f s)',
		$clients, $threads, $duration, $xacts, $span, $tps, $t_bench));
for my $i (0 .. $#scripts)
{
	note(sprintf('  script %s: %d transactions, %.0f tps',
			$scripts[$i]{name}, $per_script[$i], $per_script[$i] / $span));
}

# ------------------------------------------------------------- invariants --

my $rolled_back = $node->safe_psql('postgres',
	q{SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM rolled_back_grants});

for my $b (sort keys %bucket)
{
	my ($rate, $cap) = @{ $bucket{$b} }{qw(rate capacity)};

	# Demand: takes attempted on this bucket per second of the run.
	my $demand = 0;
	for my $i (0 .. $#scripts)
	{
		$demand += $per_script[$i] if $scripts[$i]{bucket} eq $b;
	}
	$demand /= $span;
	cmp_ok($demand, '>=', $saturation_min * $rate,
		"$b: demand saturates (${\ sprintf('%.0f', $demand)} takes/s vs rate $rate/s)");

	# T from the bucket's own clock: created full at its first take, last
	# grant at last_granted_at.
	my ($rows, $takes, $tokens, $T, $bound) = query_row($node, qq{
SELECT (SELECT count(*) FROM grants WHERE endpoint = '$b'),
       b.takes_granted,
       b.tokens_granted,
       extract(epoch FROM b.last_granted_at - b.created_at),
       $rate * extract(epoch FROM b.last_granted_at - b.created_at) + $cap
FROM ratebucket.buckets AS b WHERE b.endpoint = '$b'});
	die "no bucket row for $b" unless defined $bound;

	is($rows, $takes,
		"$b: every recorded grant is counted, and nothing else (grants rows = takes_granted)");
	ok($tokens == $takes, "$b: tokens_granted = takes_granted ($tokens)");
	ok($takes <= $bound + 1e-6,
		"$b: bound: takes_granted $takes <= rate*T + capacity = $bound");
	# The counter lives in the bucket row; a lost update would undercount
	# it along with the tokens.  The grants rows are the independent record.
	ok($rows <= $bound + 1e-6,
		"$b: bound: grants rows $rows <= rate*T + capacity = $bound");
	my $eff = $takes / $bound;
	ok($eff >= $efficiency_min,
		sprintf('%s: efficiency: %d grants = %.2f%% of rate*T + capacity (>= %d%%)',
			$b, $takes, 100 * $eff, 100 * $efficiency_min));

	# Every pair of grants i < j (by grant time):
	#   (j - i) - rate*(t_j - t_i) <= capacity
	# (the maximum over all pairs in one pass: window_excess).
	my ($excess, undef, $n_grants) = window_excess($node, "grants WHERE endpoint = '$b'", $rate);
	ok($excess <= $cap + 1e-6,
		sprintf('%s: sliding window, all %d pairs of grants: max (j-i) - rate*(t_j-t_i) = %.3f <= capacity %s',
			$b, $n_grants * ($n_grants - 1) / 2, $excess, $cap));

	# The same for windows of fixed lengths, as a ratio to the bound: the
	# grants in (t_i, t_i + w] never exceed rate*w + capacity.
	my @w = (0.1, 0.5, 1, 2);
	my @max = query_row($node,
		"SELECT "
		  . join(', ', map { "coalesce(max(n$_), 0)" } 0 .. $#w)
		  . " FROM (SELECT "
		  . join(', ',
			map {
				"count(*) OVER (ORDER BY at RANGE BETWEEN CURRENT ROW AND "
				  . "interval '$w[$_] s' FOLLOWING EXCLUDE GROUP) AS n$_"
			} 0 .. $#w)
		  . " FROM grants WHERE endpoint = '$b') AS s");
	my ($worst, $worst_w) = (0, undef);
	for my $k (0 .. $#w)
	{
		my $wbound = $rate * $w[$k] + $cap;
		my $ratio  = $max[$k] / $wbound;
		($worst, $worst_w) = ($ratio, $w[$k]) if $ratio > $worst;
		ok($max[$k] <= $wbound,
			sprintf('%s: window %.1f s: at most %d grants <= rate*w + capacity = %g (%.3f)',
				$b, $w[$k], $max[$k], $wbound, $ratio));
	}

	note(sprintf('%s (rate %g/s, capacity %g): demand %.0f takes/s; %d grants in T = %.6f s; bound rate*T + capacity = %.3f; efficiency %.2f%%; worst window ratio %.4f (w = %.1f s); all-pairs max excess %.3f of capacity %g',
			$b, $rate, $cap, $demand, $takes, $T, $bound, 100 * $eff,
			$worst, $worst_w, $excess, $cap));
}

# The rolled-back takes were granted (so the check above means something),
# and none of them is in takes_granted (checked above: grants rows =
# takes_granted, and the rollback script inserts no grants row) nor cost the
# hot bucket's committed takers their efficiency (checked above).
my ($hot_takes, $hot_bound) = query_row($node, qq{
SELECT takes_granted,
       $bucket{hot}{rate} * extract(epoch FROM last_granted_at - created_at) + $bucket{hot}{capacity}
FROM ratebucket.buckets WHERE endpoint = 'hot'});
cmp_ok($rolled_back, '>=', 0.1 * $hot_takes,
	"hot: rollback script was granted and rolled back $rolled_back takes (vs $hot_takes committed)");
# Together, committed and rolled-back grants exceed what the bucket can
# grant: the rolled-back tokens came back and were granted again.
cmp_ok($hot_takes + $rolled_back, '>', $hot_bound,
	"hot: committed + rolled-back grants (${\ ($hot_takes + $rolled_back)}) exceed rate*T + capacity ($hot_bound): rolled-back tokens were returned");
note(sprintf('hot: %d granted takes rolled back, %d committed (%.0f%% of all granted takes on hot rolled back)',
		$rolled_back, $hot_takes, 100 * $rolled_back / ($rolled_back + $hot_takes)));

$node->stop;
note(sprintf('001_load.pl total runtime %.1f s', Time::HiRes::time() - $t_start));

done_testing();
