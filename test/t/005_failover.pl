# 005_failover.pl — the primary dies mid-load, its streaming standby is
# promoted and takes over the load: what do the buckets keep?
#
# Two scenarios, each with a fresh primary and a streaming standby made from
# its base backup ($node_primary->backup, init_from_backup(has_streaming)):
#
#   sync   synchronous_standby_names = '*' on the primary, synchronous_commit =
#          on: a commit returns only once the standby has flushed it.
#   async  no synchronous standby: a commit returns once it is flushed
#          locally, and the standby may lag behind by a committed tail.
#
# In each: pgbench loads two buckets from 8 clients on the primary (every
# granted take inserts a row in "grants" in the same transaction, as in
# 001_load.pl and 002_crash_restart.pl) for about 3 s; then replication lags:
# the primary's walsender is frozen (SIGSTOP) for 0.5 s, as by a stalled
# network, while the load goes on; then the whole primary is killed hard, as
# in 002 (postmaster SIGSTOPped, its children SIGKILLed, then the postmaster:
# the walsender never sends the WAL of that last half second);
# the standby is promoted and pgbench loads it for 3 s.  Then the old primary
# is restarted standalone (crash recovery, no standby, nobody connects but
# this test) to count what it had committed: its grants rows are the
# reference of what was granted before the failover.
#
# Asserted in both scenarios, on the new primary (the surviving history):
#
#   Consistency     count(grants) = takes_granted per bucket: the take and its
#                   grants row replicated together or not at all.
#   Prefix          every pre-failover grants row on the new primary is one
#                   the old primary committed (the standby holds a prefix of
#                   the old primary's history, never anything else).
#   Bound           count(grants) <= rate*(last_granted_at - created_at) +
#                   capacity, failover downtime included.
#   Sliding window  over every pair of grants i < j by grant time,
#                   j - i <= rate*(t_j - t_i) + capacity (derivation and SQL as
#                   in 001_load.pl), and separately over the pairs straddling
#                   the failover.  Both nodes run on this machine's clock.
#
# sync, in addition:
#
#   No acknowledged grant lost.  Lost grants = grants the old primary committed
#                   that are not on the new primary.  With synchronous
#                   replication only commits still waiting for the standby's
#                   acknowledgement when the primary died can be lost (their
#                   clients never heard "committed"): at most one per client,
#                   so the lost grants, all buckets together, are <= clients.
#                   (Those grants were never reported to a worker, which would
#                   have retried them: the surviving history is the truth.)
#
# async, measured (note(), not asserted; only the consistency and the
# surviving-history checks above are asserted):
#
#   Lost grants     grants committed on the old primary but missing on the
#                   promoted standby.  Each gave its tokens back: the new
#                   primary hands them out a second time.  All but at most one
#                   per client were acknowledged to a client (a worker that
#                   delivered its event), so this is real over-sending.
#   Excess          over the real history (the old primary's grants up to the
#                   failover + the new primary's grants after it):
#                   count - (rate*T + capacity) and the sliding-window maximum
#                   minus capacity: the extra tokens the lost tail let the new
#                   primary hand out, if the bucket had not refilled to
#                   capacity during the downtime anyway.
#
# The "slow" bucket (rate 100/s, capacity 400) does not refill to capacity
# during a failover of a second or two, so lost tokens would show in its
# figures; "mid" (200/s, capacity 40) refills fully during the downtime, so
# a lost tail is invisible in its bound (the refill covers it).
#
# The whole test takes about 25-30 s.  Figures are printed with note(): run
# prove with -v to see them (also in tmp_check/log/regress_log_005_failover).

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run ();
use Time::HiRes ();

use lib 'test/perl';
use RatebucketTest;

my $t_start = Time::HiRes::time();

my $clients       = 8;
my $threads       = 2;
my $before_kill   = 3;    # seconds of load on the primary
my $after_promote = 3;    # seconds of load on the promoted standby (-T)
my $lag           = 0.5;  # seconds the walsender is frozen before the kill

my %bucket = (
	slow => { rate => 100, capacity => 400 },
	mid  => { rate => 200, capacity => 40 },);
my @names = sort keys %bucket;

# One take_script per bucket, written by script_opts for each pgbench run.
my @defines = bucket_defines(\%bucket);

sub scenario
{
	my ($mode) = @_;
	my $sync = $mode eq 'sync';
	my $t0   = Time::HiRes::time();

	my $primary = start_node("${mode}_primary",
		init => { allows_streaming => 1 },
		conf => "max_connections = 30\nsynchronous_commit = on\n",
		extensions => ['amcheck']);
	$primary->safe_psql('postgres', q{
CREATE TABLE grants (
	endpoint text NOT NULL,
	at timestamptz NOT NULL DEFAULT clock_timestamp()
);
});

	$primary->backup('b');
	my $standby = PostgreSQL::Test::Cluster->new("${mode}_standby");
	$standby->init_from_backup($primary, 'b', has_streaming => 1);
	# The standby must not wait for a standby of its own once promoted.
	$standby->append_conf('postgresql.conf', "synchronous_standby_names = ''\n");
	$standby->start;
	$primary->wait_for_catchup($standby);

	if ($sync)
	{
		$primary->append_conf('postgresql.conf', "synchronous_standby_names = '*'\n");
		$primary->reload;
		$primary->poll_query_until('postgres',
			q{SELECT count(*) = 1 FROM pg_stat_replication WHERE sync_state = 'sync'})
		  or die 'the standby never became synchronous';
	}
	my $sync_state = $primary->safe_psql('postgres',
		q{SELECT string_agg(application_name || ':' || sync_state, ',') FROM pg_stat_replication});
	is($sync_state, ($sync ? "${mode}_standby:sync" : "${mode}_standby:async"),
		"$mode: the standby streams, as a " . ($sync ? 'synchronous' : 'asynchronous') . ' standby');

	# ----------------------------------------------- load on the primary --
	my ($out1, $err1) = ('', '');
	my @bench1 = (
		'pgbench', '-n', '-M', 'prepared', '-c', $clients, '-j', $threads,
		'-T', 600, '-h', $primary->host, '-p', $primary->port,
		@defines, script_opts($primary->basedir, 'run1', \%bucket), 'postgres');
	my $t_load1 = Time::HiRes::time();
	my $bench1 = IPC::Run::start(\@bench1, '<', \undef, '>', \$out1, '2>', \$err1,
		IPC::Run::timer($PostgreSQL::Test::Utils::timeout_default));
	Time::HiRes::sleep($before_kill);
	$bench1->pump_nb;
	ok($bench1->pumpable, "$mode: pgbench still running on the primary when it is killed");

	# Replication lag: the walsender is frozen for $lag s before the kill,
	# so the WAL of that last stretch never leaves the primary (on one
	# machine the standby is otherwise only microseconds behind).  With a
	# synchronous standby the commits wait meanwhile; with an asynchronous
	# one they return, and their tail is what the failover loses.
	my $walsender = $primary->safe_psql('postgres', 'SELECT pid FROM pg_stat_replication');
	die 'no walsender' unless $walsender =~ /^\d+$/;
	kill 'STOP', $walsender or die "cannot SIGSTOP walsender $walsender: $!";
	Time::HiRes::sleep($lag);

	my $t_kill = Time::HiRes::time();
	my $nkids  = scalar @{ kill_server($primary)->{children} };
	$bench1->finish;
	isnt($? >> 8, 0, "$mode: pgbench on the primary was cut off by the kill");
	cmp_ok($nkids, '>=', $clients, "$mode: the primary had its $clients backends when killed ($nkids children)");

	# ------------------------------------------------------------ promote --
	$standby->promote;
	$standby->poll_query_until('postgres', 'SELECT NOT pg_is_in_recovery()')
	  or die 'promotion did not finish';
	my $t_promoted = Time::HiRes::time();
	my $promote_at = $standby->safe_psql('postgres', 'SELECT clock_timestamp()');

	# What survived, before any new take.
	my %survived;
	for my $b (@names)
	{
		my ($rows, $takes) = query_row($standby, qq{
SELECT (SELECT count(*) FROM grants WHERE endpoint = '$b'), b.takes_granted
FROM ratebucket.buckets b WHERE b.endpoint = '$b'});
		is($rows, $takes,
			"$mode: $b: right after promotion, grants rows = takes_granted ($rows)");
		cmp_ok($rows, '>', $bucket{$b}{capacity},
			"$mode: $b: the primary was killed mid-load, after the initial burst ($rows grants)");
		$survived{$b} = $rows;
	}

	# ------------------------------------------- load on the new primary --
	my $log_prefix = $standby->basedir . '/pgbench_run2';
	$standby->command_checks_all(
		[
			'pgbench', '-n', '-M', 'prepared', '-c', $clients, '-j', $threads,
			'-T', $after_promote, '-l', "--log-prefix=$log_prefix",
			@defines, script_opts($standby->basedir, 'run2', \%bucket), 'postgres'
		],
		0,
		[
			qr{number of transactions actually processed: [1-9]\d*},
			qr{number of failed transactions: 0 \(0\.000%\)}
		],
		[qr{^$}],
		"$mode: pgbench on the promoted standby: 8 clients, no failure");
	my $stats      = pgbench_log_stats($log_prefix, scalar @names);
	my @per_script = @{ $stats->{per_script} };
	my $span2 = defined $stats->{last_end} ? $stats->{last_end} - $stats->{first_start} : 1;

	# ------------------------- the old primary, restarted standalone --
	$primary->append_conf('postgresql.conf', "synchronous_standby_names = ''\n");
	$primary->start;
	my $old_copy = $primary->safe_psql('postgres',
		q{SELECT string_agg(format('(%L, %L)', endpoint, at), ',') FROM grants});
	$primary->stop;
	$standby->safe_psql('postgres', qq{
SET TimeZone = 'UTC';
CREATE TABLE old_grants (endpoint text, at timestamptz);
INSERT INTO old_grants VALUES $old_copy;
});

	# ------------------------------------------------------------ checks --
	my $lost_total = 0;
	for my $i (0 .. $#names)
	{
		my $b = $names[$i];
		my ($rate, $cap) = @{ $bucket{$b} }{qw(rate capacity)};

		my ($rows, $takes, $T, $bound, $before, $after, $old, $not_in_old, $created_ep, $last_ep)
		  = query_row($standby, qq{
SELECT (SELECT count(*) FROM grants WHERE endpoint = '$b'),
       b.takes_granted,
       extract(epoch FROM b.last_granted_at - b.created_at),
       $rate * extract(epoch FROM b.last_granted_at - b.created_at) + $cap,
       (SELECT count(*) FROM grants WHERE endpoint = '$b' AND at < '$promote_at'),
       (SELECT count(*) FROM grants WHERE endpoint = '$b' AND at >= '$promote_at'),
       (SELECT count(*) FROM old_grants WHERE endpoint = '$b'),
       (SELECT count(*) FROM grants g WHERE endpoint = '$b' AND at < '$promote_at'
          AND NOT EXISTS (SELECT 1 FROM old_grants o WHERE o.endpoint = g.endpoint AND o.at = g.at)),
       extract(epoch FROM b.created_at),
       extract(epoch FROM b.last_granted_at)
FROM ratebucket.buckets b WHERE b.endpoint = '$b'});

		my $demand = $per_script[$i] / $span2;
		cmp_ok($demand, '>=', 2 * $rate,
			sprintf('%s: %s: the load on the new primary saturates the bucket (%.0f takes/s vs rate %g/s)',
				$mode, $b, $demand, $rate));
		is($before, $survived{$b}, "$mode: $b: the pre-failover grants are unchanged ($before)");
		cmp_ok($after, '>', 0, "$mode: $b: granted again on the new primary ($after grants)");
		is($rows, $takes,
			"$mode: $b: over the whole run, grants rows on the new primary = takes_granted ($rows)");
		is($not_in_old, 0,
			"$mode: $b: every surviving pre-failover grant was committed on the old primary ($before of its $old)");
		ok($rows <= $bound + 1e-6,
			"$mode: $b: bound across the failover: $rows grants <= rate*T + capacity = $bound");

		my ($excess, $cross, $n) = window_excess($standby,
			"grants WHERE endpoint = '$b'", $rate, $promote_at);
		ok($excess <= $cap + 1e-6,
			sprintf('%s: %s: sliding window, all %d pairs of surviving grants: max (j-i) - rate*(t_j-t_i) = %.3f <= capacity %g',
				$mode, $b, $n * ($n - 1) / 2, $excess, $cap));
		ok($cross <= $cap + 1e-6,
			sprintf('%s: %s: sliding window across the failover, %d x %d pairs: max excess %.3f <= capacity %g',
				$mode, $b, $before, $after, $cross, $cap));

		# The real history: what the old primary committed, then the new
		# primary's grants after the promotion.
		my $lost = $old - $before;
		$lost_total += $lost;
		my $real = $old + $after;
		my ($rexcess, $rcross) = window_excess($standby,
			"(SELECT at FROM old_grants WHERE endpoint = '$b' UNION ALL "
			  . "SELECT at FROM grants WHERE endpoint = '$b' AND at >= '$promote_at') AS h",
			$rate, $promote_at);
		my ($last_old) = query_row($standby,
			"SELECT extract(epoch FROM max(at)) FROM old_grants WHERE endpoint = '$b'");
		my ($first_new) = query_row($standby,
			"SELECT extract(epoch FROM min(at)) FROM grants WHERE endpoint = '$b' AND at >= '$promote_at'");
		my $gap = $first_new - $last_old;
		note(sprintf('%s: %s (rate %g/s, capacity %g): old primary committed %d grants, %d survived on the standby, lost %d; '
				  . 'new primary granted %d more; surviving history %d grants = takes_granted %d vs bound rate*T + capacity = %.1f (T = %.3f s) (%.2f%%); '
				  . 'all-pairs max excess %.3f, across the failover %.3f; '
				  . 'real history %d grants vs bound %.1f: excess %+.1f; real all-pairs max excess %.3f (over capacity: %+.3f), across the failover %.3f; '
				  . 'last old grant to first new grant: %.3f s (refills %.0f tokens)',
				$mode, $b, $rate, $cap, $old, $before, $lost, $after, $rows, $takes, $bound, $T,
				100 * $rows / $bound, $excess, $cross,
				$real, $bound, $real - $bound, $rexcess, $rexcess - $cap, $rcross,
				$gap, $rate * $gap));
	}

	if ($sync)
	{
		cmp_ok($lost_total, '<=', $clients,
			"sync: at most one in-flight (unacknowledged) grant per client lost in the failover ($lost_total lost, $clients clients)");
	}
	else
	{
		note("async: lost grants in the failover, all buckets: $lost_total "
			  . "(at most $clients of them can have been unacknowledged in-flight commits)");
	}

	is($standby->safe_psql('postgres', q{SELECT count(*) FROM verify_heapam('ratebucket.buckets')}),
		0, "$mode: amcheck: verify_heapam(ratebucket.buckets) on the new primary finds nothing");
	is( $standby->safe_psql('postgres', q{
SELECT count(*) FROM ratebucket.bucket_status
WHERE tokens >= 0 AND tokens <= capacity AND takes_granted > 0}),
		scalar(@names), "$mode: every bucket is sane in the status view of the new primary");

	$standby->stop;
	note(sprintf('%s: load on the primary %.1f s, promotion %.2f s after the kill, load on the new primary %.2f s; scenario %.1f s',
			$mode, $t_kill - $t_load1, $t_promoted - $t_kill, $span2, Time::HiRes::time() - $t0));
}

scenario('sync');
scenario('async');

note(sprintf('005_failover.pl total runtime %.1f s', Time::HiRes::time() - $t_start));
done_testing();
