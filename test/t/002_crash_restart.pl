# 002_crash_restart.pl — the server crashes mid-load; after crash recovery
# the buckets still keep their invariants, over the whole run, crash included.
#
# pgbench takes from three buckets with 8 clients; every granted take inserts
# a row in "grants" in the same transaction (as in 001_load.pl).  After about
# 2.5 s the whole server is killed with SIGKILL: the postmaster is stopped
# (SIGSTOP, so it can neither fork nor react), its children are SIGKILLed,
# then the postmaster itself.  Nothing gets to shut down or flush anything:
# the data directory is left as by a crash of every server process at once
# (the OS page cache survives, as it does when only the processes die; the
# Cluster runs with fsync = off, so this is not a power-loss test).  The node
# is restarted (crash recovery replays the WAL) and a second pgbench load
# runs.  Then, per bucket, over both loads:
#
#   Atomicity      count(grants) = takes_granted: WAL replay kept the take and
#                  its grants row together, or dropped both (checked right
#                  after the restart, and again at the end).
#   Replayed state right after the restart, the bucket row is the state left
#                  by the last committed pre-crash grant: refilled_at =
#                  last_granted_at, between the last two pre-crash grant
#                  times, and tokens <= capacity - 1 (it did not come back
#                  full).
#   After restart  the n-th grant after the restart, at g_n, satisfies
#                  n <= tokens0 + rate*(g_n - refilled_at0), with tokens0 and
#                  refilled_at0 the replayed row: the bucket handed out only
#                  what it held at the crash plus what time refilled.
#                  (Derivation: the first post-restart take, at clock c_1,
#                  holds at most tokens0 + rate*(c_1 - refilled_at0); between
#                  grants the bucket only refills; and c_n <= g_n.)
#   Bound          count(grants) <= rate*(last_granted_at - created_at) +
#                  capacity, the downtime included.
#   Sliding window over every pair of grants i < j by grant time,
#                  j - i <= rate*(t_j - t_i) + capacity (the derivation is in
#                  001_load.pl; the same SQL), and separately over the pairs
#                  that straddle the crash.
#   No damage      amcheck: bt_index_check('ratebucket.buckets_pkey', true)
#                  and verify_heapam('ratebucket.buckets') report nothing
#                  (the grants table is checked too).
#
# The "slow" bucket has a capacity far above what it refills during the
# downtime, so a bucket that came back full would hand out a burst the checks
# above refuse; "mid" and "fast" refill completely while the server is down.
#
# Figures are printed with note(): run prove with -v to see them (they are
# also in tmp_check/log/regress_log_002_crash_restart).

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

# ------------------------------------------------------------------ setup --

my $clients       = 8;
my $threads       = 2;
my $before_crash  = 2.5;    # seconds of load before the kill
my $after_restart = 3;      # seconds of load after the restart (pgbench -T: whole seconds)
# Demand must be at least this multiple of the rate in the second load, or
# the figures measure the load generator rather than the limiter.
my $saturation_min = 2;

my %bucket = (
	slow => { rate => 100, capacity => 400, weight => 1 },
	mid  => { rate => 200, capacity => 40,  weight => 1 },
	fast => { rate => 300, capacity => 30,  weight => 1 },);
my @names = sort keys %bucket;

my $node = start_node('crash', conf => "max_connections = 30\n",
	extensions => ['amcheck']);

$node->safe_psql('postgres', q{
CREATE TABLE grants (
	endpoint text NOT NULL,
	at timestamptz NOT NULL DEFAULT clock_timestamp()
);
});

# One script per bucket (pgbench numbers them in the order of their names):
# one statement, one transaction: take, and record the grant (take_script;
# script_opts writes them, with their weights, for each pgbench run).
my @defines = bucket_defines(\%bucket);

# ------------------------------------------------- load, then the crash --

my ($bench1_out, $bench1_err) = ('', '');
my $bench1_timer = IPC::Run::timer($PostgreSQL::Test::Utils::timeout_default);
my @bench1 = (
	'pgbench', '-n', '-M', 'prepared',
	'-c', $clients, '-j', $threads,
	'-T', 600,    # much longer than it will live
	'-h', $node->host, '-p', $node->port,
	@defines, script_opts($node->basedir, 'run1', \%bucket), 'postgres');
my $bench1 =
  IPC::Run::start(\@bench1, '<', \undef, '>', \$bench1_out, '2>', \$bench1_err,
	$bench1_timer);
my $t_bench1 = Time::HiRes::time();

Time::HiRes::sleep($before_crash);

# The load is running: grants are being recorded and pgbench is still alive.
my $grants_so_far = $node->safe_psql('postgres', 'SELECT count(*) FROM grants');
cmp_ok($grants_so_far, '>', 0,
	"first load running before the crash ($grants_so_far grants so far)");
$bench1->pump_nb;
ok($bench1->pumpable, 'pgbench still running when the server is killed');

# Freeze the postmaster, so it neither forks nor notices its children dying,
# then kill every child and the postmaster itself, and wait until every
# killed process is gone and reaped (a leftover backend would still be
# attached to the shared memory, a leftover postmaster pid would make the
# lock file look current, and the restart would refuse to run).
my $kill       = kill_server($node);
my $postmaster = $kill->{postmaster};
my @children   = @{ $kill->{children} };
my $t_crash    = $kill->{t_kill};
my $killed     = $kill->{killed};
my $t_gone     = Time::HiRes::time();
note(sprintf('crash: %.2f s into the first load: SIGKILL to the postmaster (%d) and its %d children (%d killed)',
		$t_crash - $t_bench1, $postmaster, scalar @children, $killed));
cmp_ok(scalar @children, '>=', $clients,
	"the server had at least $clients backends when killed (" . scalar(@children) . ' children)');

# pgbench loses its connections and gives up: a failed run is expected.
$bench1->finish;
my $bench1_rc    = $? >> 8;
my $t_bench1_end = Time::HiRes::time();
note(sprintf('killed processes gone %.3f s after the kill; pgbench exited %.3f s after that',
		$t_gone - $t_crash, $t_bench1_end - $t_gone));
note("first pgbench, stderr (first lines):\n"
	  . join("\n", grep { defined } (split /\n/, $bench1_err)[0 .. 3]));
isnt($bench1_rc, 0, "first pgbench was cut off by the crash (exit status $bench1_rc)");
like($bench1_err,
	qr/server closed the connection unexpectedly|connection to server .* lost|could not receive data|terminat|abort/i,
	'first pgbench saw its connections die');
my ($bench1_xacts) = $bench1_out =~ /number of transactions actually processed: (\d+)/;
$bench1_xacts //= 'unknown';

# ---------------------------------------------------------------- restart --

my $log_offset = -s $node->logfile;
my $t_restart0 = Time::HiRes::time();
$node->start;
my $t_restart = Time::HiRes::time() - $t_restart0;
ok( $node->log_contains(
		qr/database system was interrupted|database system was not properly shut down; automatic recovery in progress/,
		$log_offset),
	'the restart ran crash recovery');
ok($node->log_contains(qr/redo done at|redo starts at/, $log_offset),
	'crash recovery replayed WAL');

# The server's clock at the restart: every earlier grant is pre-crash.
my $restart_at = $node->safe_psql('postgres', 'SELECT clock_timestamp()');

# The replayed rows, before any new take.
my %replayed;
for my $b (@names)
{
	my ($rate, $cap) = @{ $bucket{$b} }{qw(rate capacity)};
	my ($rows, $takes, $tokens, $refilled_at, $last_granted_at, $refilled_is_last,
		$after_prev, $before_last, $refilled_ep, $last_grant_ep, $tokens_now)
	  = query_row($node, qq{
WITH g AS (
  SELECT at, row_number() OVER (ORDER BY at DESC) AS k
  FROM grants WHERE endpoint = '$b')
SELECT (SELECT count(*) FROM g),
       b.takes_granted, b.tokens, b.refilled_at, b.last_granted_at,
       b.refilled_at = b.last_granted_at,
       b.last_granted_at >= coalesce((SELECT at FROM g WHERE k = 2), '-infinity'),
       b.last_granted_at <= (SELECT at FROM g WHERE k = 1),
       extract(epoch FROM b.refilled_at),
       extract(epoch FROM (SELECT at FROM g WHERE k = 1)),
       s.tokens
FROM ratebucket.buckets AS b JOIN ratebucket.bucket_status AS s USING (endpoint)
WHERE b.endpoint = '$b'});
	die "no bucket row for $b after the restart" unless defined $tokens_now;

	is($rows, $takes,
		"$b: after crash recovery, grants rows = takes_granted ($rows): both or neither survived");
	cmp_ok($rows, '>', $cap,
		"$b: the crash came mid-load, after the initial burst ($rows grants > capacity $cap)");
	is($refilled_is_last, 't',
		"$b: after crash recovery, refilled_at = last_granted_at (the row is a granted take's)");
	ok($after_prev eq 't' && $before_last eq 't',
		"$b: after crash recovery, last_granted_at lies between the last two committed grants");
	cmp_ok($tokens, '<=', $cap - 1,
		"$b: after crash recovery, the stored tokens ($tokens) are what the last grant left: <= capacity - 1, not full");
	$replayed{$b} = {
		rows        => $rows,
		tokens      => $tokens,
		refilled_at => $refilled_at,
		refilled_ep => $refilled_ep,
		last_grant  => $last_grant_ep,
		tokens_now  => $tokens_now,
	};
}

# ------------------------------------------------------ the second load --

my $log_prefix = $node->basedir . '/pgbench_run2';
$node->command_checks_all(
	[
		'pgbench', '-n', '-M', 'prepared',
		'-c', $clients, '-j', $threads,
		'-T', $after_restart,
		'-l', "--log-prefix=$log_prefix",
		@defines, script_opts($node->basedir, 'run2', \%bucket), 'postgres'
	],
	0,
	[
		qr{number of transactions actually processed: [1-9]\d*},
		qr{number of failed transactions: 0 \(0\.000%\)}
	],
	[qr{^$}],
	'second pgbench after the restart: 8 clients, no failure');

# Per-transaction logs of the second load: transactions per script (that is,
# per bucket) and the span from the first start to the last end.
my $stats      = pgbench_log_stats($log_prefix, scalar @names);
my @per_script = @{ $stats->{per_script} };
my $span2 = defined $stats->{last_end} ? $stats->{last_end} - $stats->{first_start} : 0;
cmp_ok($span2, '>', 0, 'second pgbench wrote its transaction logs');
$span2 ||= 1;

# ------------------------------------------------------------- invariants --

for my $i (0 .. $#names)
{
	my $b = $names[$i];
	my ($rate, $cap) = @{ $bucket{$b} }{qw(rate capacity)};
	my $r = $replayed{$b};

	my $demand = $per_script[$i] / $span2;
	cmp_ok($demand, '>=', $saturation_min * $rate,
		sprintf('%s: second load saturates the bucket (%.0f takes/s vs rate %g/s)', $b, $demand, $rate));

	my ($rows, $takes, $T, $bound, $before, $after, $last_before, $first_after)
	  = query_row($node, qq{
SELECT (SELECT count(*) FROM grants WHERE endpoint = '$b'),
       b.takes_granted,
       extract(epoch FROM b.last_granted_at - b.created_at),
       $rate * extract(epoch FROM b.last_granted_at - b.created_at) + $cap,
       (SELECT count(*) FROM grants WHERE endpoint = '$b' AND at < '$restart_at'),
       (SELECT count(*) FROM grants WHERE endpoint = '$b' AND at >= '$restart_at'),
       (SELECT extract(epoch FROM max(at)) FROM grants WHERE endpoint = '$b' AND at < '$restart_at'),
       (SELECT extract(epoch FROM min(at)) FROM grants WHERE endpoint = '$b' AND at >= '$restart_at')
FROM ratebucket.buckets AS b WHERE b.endpoint = '$b'});
	die "no bucket row for $b" unless defined $bound;

	is($before, $r->{rows}, "$b: the pre-crash grants are unchanged ($before)");
	cmp_ok($after, '>', 0, "$b: granted again after the restart ($after grants)");
	is($rows, $takes,
		"$b: over the whole run, grants rows = takes_granted ($rows)");
	ok($rows <= $bound + 1e-6,
		"$b: bound over the whole run, downtime included: $rows grants <= rate*T + capacity = $bound");

	# After the restart: the n-th grant at g_n has n <= tokens0 + rate*(g_n -
	# refilled_at0), tokens0 and refilled_at0 as replayed.
	my ($restart_excess) = query_row($node, qq{
SELECT coalesce(max(n - $rate * (t - $r->{refilled_ep})), 0)
FROM (SELECT extract(epoch FROM at) AS t,
             count(*) OVER (ORDER BY at RANGE BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS n
      FROM grants WHERE endpoint = '$b' AND at >= '$restart_at') AS g});
	ok($restart_excess <= $r->{tokens} + 1e-6,
		sprintf('%s: after the restart, grants never outrun the replayed tokens plus refill: max n - rate*(t_n - refilled_at) = %.3f <= %.3f replayed tokens',
			$b, $restart_excess, $r->{tokens}));

	# All pairs of grants, as in 001_load.pl; then only the pairs i < j with
	# i before the crash and j after the restart.
	my ($excess, $cross, $n_grants) = window_excess($node,
		"grants WHERE endpoint = '$b'", $rate, $restart_at);
	ok($excess <= $cap + 1e-6,
		sprintf('%s: sliding window, all %d pairs of grants: max (j-i) - rate*(t_j-t_i) = %.3f <= capacity %s',
			$b, $n_grants * ($n_grants - 1) / 2, $excess, $cap));
	ok($cross <= $cap + 1e-6,
		sprintf('%s: sliding window across the crash, %d x %d pairs: max (j-i) - rate*(t_j-t_i) = %.3f <= capacity %s',
			$b, $before, $after, $cross, $cap));

	# Figures.  "available": what the replayed bucket held at the first
	# post-restart grant, plus the refill until the last grant.  "teeth": how
	# many more tokens a bucket that came back full would have held at that
	# moment; when it is 1 or more, the after-restart check above would have
	# refused such a bucket.
	my $gap      = $first_after - $last_before;
	my $eff      = $takes / $bound;
	my $at_first = $r->{tokens} + $rate * ($first_after - $r->{refilled_ep});
	$at_first = $cap if $at_first > $cap;
	my ($last2) = query_row($node, qq{SELECT extract(epoch FROM last_granted_at) FROM ratebucket.buckets WHERE endpoint = '$b'});
	my $available = $at_first + $rate * ($last2 - $first_after);
	my $teeth     = $cap - $at_first;
	note(sprintf('%s (rate %g/s, capacity %g): grants %d before the crash + %d after the restart = %d = takes_granted %d; T = %.3f s (downtime included); bound rate*T + capacity = %.1f; efficiency %.2f%% (downtime included); all-pairs max excess %.3f, across the crash %.3f (capacity %g)',
			$b, $rate, $cap, $before, $after, $rows, $takes, $T, $bound, 100 * $eff, $excess, $cross, $cap));
	note(sprintf('%s: replayed row: %.3f tokens at the last pre-crash grant; %.3f s from the last pre-crash grant to the first post-restart grant refills %.1f tokens; a bucket back full would have held %.1f more (%s); after the restart %d grants of about %.1f available (%.2f%%), demand %.0f takes/s',
			$b, $r->{tokens}, $gap, $rate * $gap, $teeth,
			($teeth >= 1 ? 'caught by the checks' : 'not detectable: time refilled it'),
			$after, $available, 100 * $after / $available, $demand));
}

# ------------------------------------------------------------------ amcheck --

my $heap_damage = $node->safe_psql('postgres',
	q{SELECT count(*) FROM verify_heapam('ratebucket.buckets')});
is($heap_damage, 0, 'amcheck: verify_heapam(ratebucket.buckets) finds nothing');
my $heap_report = $node->safe_psql('postgres',
	q{SELECT string_agg(format('%s/%s/%s: %s', blkno, offnum, attnum, msg), E'\n') FROM verify_heapam('ratebucket.buckets')});
diag("verify_heapam: $heap_report") if $heap_report ne '';
my ($rc_idx, $out_idx, $err_idx) = $node->psql('postgres',
	q{SELECT bt_index_check('ratebucket.buckets_pkey', true)});
is($rc_idx, 0, 'amcheck: bt_index_check(ratebucket.buckets_pkey, heapallindexed) passes')
  or diag($err_idx);
($rc_idx, $out_idx, $err_idx) = $node->psql('postgres',
	q{SELECT bt_index_parent_check('ratebucket.buckets_pkey', true, true)});
is($rc_idx, 0, 'amcheck: bt_index_parent_check(ratebucket.buckets_pkey, heapallindexed, rootdescend) passes')
  or diag($err_idx);
is($node->safe_psql('postgres', q{SELECT count(*) FROM verify_heapam('grants')}),
	0, 'amcheck: verify_heapam(grants) finds nothing');

# The table still answers the way the rest of the extension expects.
is( $node->safe_psql('postgres', q{
SELECT count(*) FROM ratebucket.bucket_status
WHERE tokens >= 0 AND tokens <= capacity AND takes_granted > 0}),
	scalar(@names),
	'every bucket is sane in the status view after the crash');

$node->stop;
note(sprintf('first load: %s transactions before the crash; restart (crash recovery) took %.2f s; second load %.2f s',
		$bench1_xacts, $t_restart, $span2));
note(sprintf('002_crash_restart.pl total runtime %.1f s', Time::HiRes::time() - $t_start));

done_testing();
