# 006_clock_steps.pl — the server's wall clock steps backwards and forwards
# mid-load (invariant 5, "One clock": a clock that steps backwards refills
# nothing and never corrupts state).
#
# How the clock is stepped: the postmaster runs under libfaketime (Debian
# package "libfaketime"), preloaded with
#
#   LD_PRELOAD=/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1
#   FAKETIME_TIMESTAMP_FILE=<file>   the offset, e.g. "+0", "-1h", "+1d"
#   FAKETIME_NO_CACHE=1              re-read the file on every clock call, so
#                                    a step applies at once, in every process
#                                    (the default caches it for 10 s)
#   FAKETIME_DONT_FAKE_MONOTONIC=1   fake only the wall clock (CLOCK_REALTIME,
#                                    gettimeofday, time): CLOCK_MONOTONIC, which
#                                    PostgreSQL uses for latch and wait timeouts
#                                    and instr_time, keeps running, as it does
#                                    when NTP or an admin steps a real clock
#   NO_FAKE_STAT=1                   file timestamps stay real (the postmaster
#                                    checks its lock file, stats files...)
#
# The file is replaced atomically (write, then rename) to step the clock.
# Only the server is faked: the variables are set in %ENV only around
# $node->start (pg_ctl passes them to the postmaster, whose children inherit
# them) and removed right after, so psql, pgbench and this script run on the
# real clock.  The test checks both: after each step the server's
# clock_timestamp() minus this script's time is the offset.  (Do not call
# pg_sleep() on such a server: it measures its sleep with the wall clock.)
#
# The run: pgbench, 8 clients, two buckets far above their rates, every grant
# recorded in "grants" in the same transaction as the take (as in 001), with
# the server's clock_timestamp() ("at"), the take's "remaining", and a
# sequence number drawn under the row lock ("seq": the commit order of a
# bucket's grants, whatever the clock says).  Four phases of about 2 s, by the
# server's offset from real time:
#
#   A  +0      the baseline
#   B  -1 h    a step backwards of one hour
#   C  +0      a step forwards of one hour (the clock is right again)
#   D  +1 day  a step forwards of one day
#
# What grant times mean: within a phase the server clock is real time plus a
# constant, so the window arithmetic of 001 holds within a phase; across a
# step it does not (B's grants are "an hour before" A's).  Grants are put in
# a phase by their clock (the phases are hours apart; A and C split at the
# middle of B in real time), and the checks are per phase, plus "seq" for the
# order across phases.  Asserted:
#
#   Phases          the server clock follows each step (offset within 1 s),
#                   and per bucket the phases are contiguous in seq order.
#   B refills nothing
#                   count(B grants) <= tokens left by the last A grant, plus
#                   the refill a take still on the A clock (a take straddling
#                   the step) could have had: r_L + rate*(t_step - g_{L-1}),
#                   with g_{L-1} the grant before it (sound: such a take's
#                   clock is at most t_step and at least g_{L-1}).  And B's
#                   grants, in seq order, each leave exactly one token less than
#                   the one before: no refill between any two of them.
#                   A single-session probe (rate 1/s, capacity 3): emptied in
#                   A, it is still refused more than 2 s of real time later
#                   in B.
#   refilled_at never moves backwards
#                   sampled every ~0.2 s through all phases, per bucket it is
#                   non-decreasing; in B it is at or after its value just
#                   before the step, and ahead of the server clock.
#   Forward steps refill at most to capacity
#                   in C and D, the grants in the first 0.1 s of the phase
#                   are <= capacity + rate*0.1 + 1; the sliding window of 001
#                   holds within each phase; the probe, empty before D,
#                   grants exactly its capacity right after the +1 day step,
#                   then refuses.
#   Real-time bound over the whole run: grants <= rate*T_real + 2*capacity
#                   (one burst at the creation, one allowed by the +1 day
#                   step; C only brings the clock back to real time).
#   No damage       count(grants) = takes_granted = tokens_granted; every
#                   row invariant of ratebucket.buckets holds on every row
#                   (limits, tokens, configuration, adaptation); tokens are finite, in
#                   [0, capacity]; amcheck verify_heapam and bt_index_check.
#
# Figures (grants per phase, the step slack, the wait_seconds a refused take
# reports in B) are printed with note(); run prove -v to see them.  About
# 15 s.

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

my $libfaketime = '/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1';
plan skip_all => "libfaketime not installed ($libfaketime): apt-get install libfaketime"
  unless -r $libfaketime;

my $clients  = 8;
my $threads  = 2;
my $phase_s  = 2;     # seconds per phase
my %bucket = (
	low  => { rate => 100, capacity => 20 },
	high => { rate => 400, capacity => 100 },);
my @names = sort keys %bucket;
# phase, offset (libfaketime syntax), offset in seconds
my @phases = (
	[ A => '+0',  0 ],
	[ B => '-1h', -3600 ],
	[ C => '+0',  0 ],
	[ D => '+1d', 86400 ],);

# Started below, under libfaketime.
my $node = new_node('clock', conf => "max_connections = 30\n");

my $ft_file = $node->basedir . '/faketime.rc';
sub set_offset
{
	my ($spec) = @_;
	open my $fh, '>', "$ft_file.tmp" or die "cannot write $ft_file.tmp: $!";
	print $fh "$spec\n";
	close $fh or die;
	rename "$ft_file.tmp", $ft_file or die "cannot rename to $ft_file: $!";
	return;
}
set_offset('+0');

{
	local $ENV{LD_PRELOAD}                   = $libfaketime;
	local $ENV{FAKETIME_TIMESTAMP_FILE}      = $ft_file;
	local $ENV{FAKETIME_NO_CACHE}            = 1;
	local $ENV{FAKETIME_DONT_FAKE_MONOTONIC} = 1;
	local $ENV{NO_FAKE_STAT}                 = 1;
	$node->start;
}
ok(!exists $ENV{LD_PRELOAD}, 'libfaketime is preloaded in the server only, not in the clients');

# Server clock minus real (this script's) clock, in seconds.
sub server_offset
{
	my $t0 = Time::HiRes::time();
	my $s  = $node->safe_psql('postgres', 'SELECT extract(epoch FROM clock_timestamp())');
	my $t1 = Time::HiRes::time();
	return $s - ($t0 + $t1) / 2;
}

# Wait until the server clock shows the offset (it should at once).
sub check_offset
{
	my ($phase, $want) = @_;
	my $off;
	for (1 .. 20)
	{
		$off = server_offset();
		last if abs($off - $want) < 1;
		Time::HiRes::sleep(0.05);
	}
	ok(abs($off - $want) < 1,
		sprintf('phase %s: the server clock is %+.3f s off real time (want %+d)', $phase, $off, $want));
	return $off;
}

check_offset('A', 0);
# Prove the faking is live before relying on it: a step back and forth.
set_offset('-1h');
check_offset('(trial)', -3600);
set_offset('+0');
check_offset('A', 0);

create_extensions($node, 'amcheck');
$node->safe_psql('postgres', q{
CREATE SEQUENCE grant_seq;
CREATE TABLE grants (
	endpoint  text NOT NULL,
	at        timestamptz NOT NULL DEFAULT clock_timestamp(),
	remaining float8 NOT NULL,
	seq       bigint NOT NULL DEFAULT nextval('grant_seq')
);
});

# A probe bucket, one session, rate 1/s, capacity 3: emptied in A.
sub probe
{
	my ($tokens) = @_;
	my ($allowed, $remaining, $wait) = query_row($node,
		"SELECT allowed, remaining, wait_seconds FROM ratebucket.bucket_take('probe', 1, 3, $tokens)");
	return ($allowed, $remaining, $wait);
}

# ---------------------------------------------------------------- load --

my %files;
my @defines;
for my $b (@names)
{
	my $file = $node->basedir . "/take_$b";
	PostgreSQL::Test::Utils::append_to_file($file, qq{
INSERT INTO grants(endpoint, remaining)
SELECT :${b}_ep::text, remaining FROM ratebucket.bucket_take(:${b}_ep, :${b}_rate, :${b}_cap)
WHERE allowed;
});
	push @defines, '-f', $file, bucket_defines(\%bucket, $b);
}
my ($bench_out, $bench_err) = ('', '');
my $bench_T = $phase_s * @phases + 1;
my $t_load = Time::HiRes::time();
my $bench  = IPC::Run::start(
	[
		'pgbench', '-n', '-M', 'prepared', '-c', $clients, '-j', $threads,
		'-T', $bench_T, '-h', $node->host, '-p', $node->port, @defines, 'postgres'
	],
	'<', \undef, '>', \$bench_out, '2>', \$bench_err,
	IPC::Run::timer($PostgreSQL::Test::Utils::timeout_default));

# Samples of the bucket rows: [phase, real time, endpoint, refilled_at (epoch),
# server clock (epoch), refilled_at (text)].
# One session for all of them: a new psql per sample can take longer than a
# phase on a loaded machine.
my @samples;
my $sampler = $node->background_psql('postgres');
sub sample
{
	my ($phase) = @_;
	my $t   = Time::HiRes::time();
	my $out = $sampler->query_safe(q{
SELECT endpoint, extract(epoch FROM refilled_at), extract(epoch FROM clock_timestamp()), refilled_at
FROM ratebucket.buckets WHERE endpoint IN ('low', 'high') ORDER BY endpoint});
	my %row;
	for my $line (split /\n/, $out)
	{
		my ($ep, $r, $c, $rt) = split /\|/, $line;
		push @samples, [ $phase, $t, $ep, $r, $c, $rt ];
		$row{$ep} = [ $r, $c, $rt ];
	}
	return \%row;
}

my (%t_step, %pre_step, %probe);
my $stepping_ok = 1;
for my $i (0 .. $#phases)
{
	my ($phase, $spec, $want) = @{ $phases[$i] };
	if ($i > 0)
	{
		$pre_step{$phase} = sample($phases[ $i - 1 ][0]);
		set_offset($spec);
		$t_step{$phase} = Time::HiRes::time();
		check_offset($phase, $want);
	}
	else
	{
		$t_step{$phase} = $t_load;
	}

	if ($phase eq 'A')
	{
		$probe{A} = [ probe(3) ];
	}
	elsif ($phase eq 'B')
	{
		# > 2 s of real time after emptying it: a refill on the real clock
		# would have given it 2 tokens.
		Time::HiRes::sleep(0.5);
		$probe{B} = [ probe(1) ];
		$probe{B_real_elapsed} = Time::HiRes::time() - $probe{A_time};
	}
	elsif ($phase eq 'C')
	{
		$probe{C} = [ probe(1) ];
		$probe{C2} = [ probe(2) ];    # empty it again before D
	}
	elsif ($phase eq 'D')
	{
		$probe{D}  = [ probe(3) ];
		$probe{D2} = [ probe(1) ];
	}
	$probe{A_time} //= Time::HiRes::time();

	# at least three samples in each phase, however slow the probes were
	my $until = $t_step{$phase} + $phase_s;
	my $n = 0;
	while (Time::HiRes::time() < $until || $n < 3)
	{
		sample($phase);
		$n++;
		Time::HiRes::sleep(0.2);
	}
}
$bench->finish;
$sampler->quit;
my $t_end = Time::HiRes::time();
is($? >> 8, 0, 'pgbench ran through every clock step without an error')
  or diag($bench_err);
like($bench_out, qr/number of failed transactions: 0 \(0\.000%\)/, 'pgbench: no failed transaction');
my ($xacts) = $bench_out =~ /number of transactions actually processed: (\d+)/;
$xacts //= 0;
note(sprintf('pgbench: %d transactions in %.1f s (%.0f tps), phases of %d s', $xacts,
		$t_end - $t_load, $xacts / ($t_end - $t_load), $phase_s));
cmp_ok($xacts / ($t_end - $t_load), '>', 4 * ($bucket{low}{rate} + $bucket{high}{rate}),
	'demand far above the rates');

# Back to real time before checking (so the status view and amcheck run on
# a sane clock; the D state stays ahead of it, which is itself a case).
set_offset('+0');
check_offset('after', 0);

# ------------------------------------------------------------- phases --

my $split_ac = ($t_step{B} + $t_step{C}) / 2;
$node->safe_psql('postgres', qq{
CREATE TABLE gp AS
SELECT g.*,
       CASE WHEN at < to_timestamp($t_step{B}) - interval '30 min' THEN 'B'
            WHEN at > to_timestamp($t_step{D}) + interval '12 h' THEN 'D'
            WHEN at < to_timestamp($split_ac) THEN 'A'
            ELSE 'C' END AS phase
FROM grants g;
});
is($node->safe_psql('postgres', q{
SELECT count(*) FROM (
  SELECT phase, lag(phase) OVER (PARTITION BY endpoint ORDER BY seq) AS prev FROM gp) s
WHERE phase < prev}),
	0, 'per bucket, the phases (by grant clock) are contiguous in commit (seq) order');

for my $b (@names)
{
	my ($rate, $cap) = @{ $bucket{$b} }{qw(rate capacity)};
	my %n = map { $_->[0] => 0 } @phases;
	for my $line (split /\n/,
		$node->safe_psql('postgres', "SELECT phase, count(*) FROM gp WHERE endpoint = '$b' GROUP BY phase"))
	{
		my ($p, $c) = split /\|/, $line;
		$n{$p} = $c;
	}
	cmp_ok($n{A}, '>', $cap, "$b: phase A: granted ($n{A})");

	# --- B: nothing refilled ---
	my ($r_last, $g_prev) = query_row($node, qq{
SELECT remaining, extract(epoch FROM lag(at) OVER w)
FROM gp WHERE endpoint = '$b' AND phase = 'A'
WINDOW w AS (ORDER BY seq) ORDER BY seq DESC LIMIT 1});
	my $slack = $rate * ($t_step{B} - $g_prev);
	ok($n{B} <= $r_last + $slack + 1e-6,
		sprintf('%s: phase B (clock -1 h): %d grants <= %.3f tokens left by the last A grant + %.3f a take straddling the step could have refilled',
			$b, $n{B}, $r_last, $slack));
	is($node->safe_psql('postgres', qq{
SELECT count(*) FROM (
  SELECT remaining, lag(remaining) OVER (ORDER BY seq) AS prev FROM gp
  WHERE endpoint = '$b' AND phase = 'B') s
WHERE prev IS NOT NULL AND abs(prev - 1 - remaining) > 1e-9}),
		0, "$b: phase B: each grant leaves exactly one token less than the previous one (no refill)");

	# refilled_at: never backwards, in B at/after its pre-step value and
	# ahead of the clock.
	my @s = grep { $_->[2] eq $b } @samples;
	my $backwards = grep { $s[$_][3] < $s[ $_ - 1 ][3] } 1 .. $#s;
	is($backwards, 0,
		sprintf('%s: refilled_at never moved backwards over %d samples across all phases', $b, scalar @s));
	my $pre = $pre_step{B}{$b}[0];
	my @sb  = grep { $_->[0] eq 'B' } @s;
	cmp_ok(scalar @sb, '>=', 3, "$b: refilled_at sampled during B (" . scalar(@sb) . ' samples)');
	is(scalar(grep { $_->[3] < $pre } @sb), 0,
		"$b: during B, refilled_at >= its value before the step ($pre_step{B}{$b}[2])");
	is(scalar(grep { $_->[3] <= $_->[4] } @sb), 0,
		"$b: during B, refilled_at stays ahead of the stepped-back clock");

	# --- C and D: forward steps refill at most to capacity ---
	for my $p (qw(C D))
	{
		my ($first_n, $total) = query_row($node, qq{
SELECT count(*) FILTER (WHERE at <= f + interval '0.1 s'), count(*)
FROM gp, (SELECT min(at) AS f FROM gp WHERE endpoint = '$b' AND phase = '$p') m
WHERE endpoint = '$b' AND phase = '$p'});
		cmp_ok($total, '>', 0, "$b: phase $p: granted ($total)");
		ok($first_n <= $cap + $rate * 0.1 + 1,
			sprintf('%s: phase %s: %d grants in its first 0.1 s <= capacity + rate*0.1 + 1 = %g',
				$b, $p, $first_n, $cap + $rate * 0.1 + 1));
		$n{"${p}_first"} = $first_n;
	}
	for my $p (qw(A B C D))
	{
		my ($excess) = window_excess($node, "gp WHERE endpoint = '$b' AND phase = '$p'", $rate);
		ok($excess <= $cap + 1e-6,
			sprintf('%s: phase %s: sliding window within the phase: max (j-i) - rate*(t_j-t_i) = %.3f <= capacity %g',
				$b, $p, $excess, $cap));
		$n{"${p}_excess"} = $excess;
	}

	# --- whole run, real time ---
	my ($rows, $takes, $tokens, $created) = query_row($node, qq{
SELECT (SELECT count(*) FROM grants WHERE endpoint = '$b'), takes_granted, tokens_granted,
       extract(epoch FROM created_at)
FROM ratebucket.buckets WHERE endpoint = '$b'});
	is($rows, $takes, "$b: grants rows = takes_granted ($rows)");
	ok($tokens == $takes, "$b: tokens_granted = takes_granted");
	my $T_real = $t_end - $created;
	my $rbound = $rate * $T_real + 2 * $cap;
	ok($rows <= $rbound,
		sprintf('%s: real-time bound: %d grants <= rate*T_real + 2*capacity = %.1f (T_real %.3f s)',
			$b, $rows, $rbound, $T_real));

	note(sprintf('%s (rate %g/s, capacity %g): grants per phase A %d, B (-1 h) %d, C (+1 h) %d, D (+1 d) %d = %d; '
			  . 'B: last A grant left %.3f tokens, straddle slack %.3f; first 0.1 s of C: %d, of D: %d (capacity + rate*0.1 = %g); '
			  . 'window excess per phase A %.2f B %.2f C %.2f D %.2f; real time: %d grants vs rate*T_real + capacity = %.1f (%+.1f: the +1 d step may add up to %g)',
			$b, $rate, $cap, $n{A}, $n{B}, $n{C}, $n{D}, $rows, $r_last, $slack,
			$n{C_first}, $n{D_first}, $cap + $rate * 0.1,
			$n{A_excess}, $n{B_excess}, $n{C_excess}, $n{D_excess},
			$rows, $rate * $T_real + $cap, $rows - ($rate * $T_real + $cap), $cap));
}

# ------------------------------------------------------------- probe --

is($probe{A}[0], 't', 'probe: A: takes its 3 tokens (empty)');
is($probe{B}[0], 'f',
	sprintf('probe: B: still refused %.2f s of real time later (a backward step refills nothing)',
		$probe{B_real_elapsed}));
note(sprintf('probe: a refused take in B reports wait_seconds = %.1f s (the stepped-back hour included: '
		  . 'a worker that sleeps that long stalls for the size of the backward step)', $probe{B}[2]));
is($probe{C}[0], 't', 'probe: C: the clock back at real time refills with the real time elapsed');
is($probe{D}[0], 't', 'probe: D (+1 day): the bucket holds its full capacity of 3');
is($probe{D2}[0], 'f',
	sprintf('probe: D: and no more: the next take is refused (remaining %.4f)', $probe{D2}[1]));

# ------------------------------------------------------------- damage --

# The row invariants (the table has no CHECK constraints, for speed: see
# the install script), each row checked.
my $bad = $node->safe_psql('postgres', q{
SELECT count(*) FROM ratebucket.buckets
WHERE NOT (octet_length(endpoint) BETWEEN 1 AND 1024
           AND rate > 0 AND capacity > 0 AND rate <= 1e12 AND capacity <= 1e12
           AND tokens >= 0 AND tokens <= capacity
           AND (conf_rate IS NULL) = (conf_capacity IS NULL)
           AND (conf_rate IS NULL) = (configured_at IS NULL)
           AND rate_factor > 0 AND rate_factor <= 1
           AND failure_run >= 0 AND breaker_trips >= 0)});
is($bad, 0, 'every row of ratebucket.buckets keeps the table\'s invariants');
is($node->safe_psql('postgres', q{
SELECT count(*) FROM ratebucket.buckets
WHERE NOT (tokens >= 0 AND tokens <= capacity AND tokens < 'Infinity'::float8
           AND refilled_at >= created_at AND takes_granted >= 0)}),
	0, 'every bucket row: tokens finite in [0, capacity], refilled_at >= created_at');
is($node->safe_psql('postgres', q{SELECT count(*) FROM verify_heapam('ratebucket.buckets')}),
	0, 'amcheck: verify_heapam(ratebucket.buckets) finds nothing');
my ($rc, $o, $e) = $node->psql('postgres',
	q{SELECT bt_index_check('ratebucket.buckets_pkey', true)});
is($rc, 0, 'amcheck: bt_index_check(ratebucket.buckets_pkey, heapallindexed)') or diag($e);
is($node->safe_psql('postgres', q{
SELECT count(*) FROM ratebucket.bucket_status WHERE tokens >= 0 AND tokens <= capacity}),
	3, 'the status view is sane for every bucket');

$node->stop;
note(sprintf('006_clock_steps.pl total runtime %.1f s', Time::HiRes::time() - $t_start));
done_testing();
