# RatebucketTest — helpers shared by ratebucket's TAP tests (test/t/*.pl).
#
# Only mechanics live here: the clusters the tests start (initialised and
# configured alike, with the extension created), reading a row of SQL,
# writing the pgbench take scripts and reading pgbench's per-transaction
# logs, killing a server hard, and the sliding-window query.  What a test
# asserts (the checks, thresholds, test names and the figures it prints)
# stays in the test.
#
# The tests load it with
#     use lib 'test/perl';
#     use RatebucketTest;
# which works because prove runs from the repository root (PGXS: cd $(srcdir)
# && prove ... test/t/*.pl).  It needs PostgreSQL's test modules
# (PostgreSQL::Test::Cluster, ::Utils) on @INC, as the tests themselves do.

package RatebucketTest;

use strict;
use warnings;

use Exporter 'import';
use PostgreSQL::Test::Cluster ();
use PostgreSQL::Test::Utils ();
use Time::HiRes ();

our @EXPORT = qw(
  new_node
  start_node
  create_extensions
  query_row
  take_script
  bucket_defines
  script_opts
  pgbench_log_stats
  children_of
  kill_server
  window_excess
  window_excess_bracketed
);

# A new cluster called $name, initialised (with the options of $opt{init},
# e.g. { allows_streaming => 1 }) and configured with log_statement = none
# and then the lines of $opt{conf}; not started.  Cluster.pm has every
# statement logged: at thousands of transactions per second that is only
# noise and I/O.
sub new_node
{
	my ($name, %opt) = @_;
	my $node = PostgreSQL::Test::Cluster->new($name);
	$node->init(%{ $opt{init} // {} });
	$node->append_conf('postgresql.conf',
		"\nlog_statement = none\n" . ($opt{conf} // ''));
	return $node;
}

# new_node, started, with ratebucket created in its "postgres" database and
# then the extensions of $opt{extensions} (e.g. ['amcheck']).
sub start_node
{
	my ($name, %opt) = @_;
	my $node = new_node($name, %opt);
	$node->start;
	create_extensions($node, @{ $opt{extensions} // [] });
	return $node;
}

# CREATE EXTENSION ratebucket, then each of @more, in $node's "postgres"
# database.
sub create_extensions
{
	my ($node, @more) = @_;
	$node->safe_psql('postgres',
		join('', map { "CREATE EXTENSION $_;\n" } 'ratebucket', @more));
	return;
}

# One row of a query on $node's "postgres" database, as a list of its
# '|'-separated fields: most checks need a few numbers from one SELECT.
sub query_row
{
	my ($node, $sql) = @_;
	my $out = $node->safe_psql('postgres', $sql);
	return split /\|/, $out;
}

# The pgbench script that takes one token from bucket $b and, if granted,
# records the grant in "grants" (endpoint text, at timestamptz DEFAULT
# clock_timestamp()) in the same transaction: the grants rows are the
# independent record the invariants are checked against.  Its variables come
# from bucket_defines.
sub take_script
{
	my ($b) = @_;
	return qq{
INSERT INTO grants(endpoint)
SELECT :${b}_ep::text FROM ratebucket.bucket_take(:${b}_ep, :${b}_rate, :${b}_cap)
WHERE allowed;
};
}

# pgbench -D options giving each bucket's script its endpoint, rate and
# capacity (:<b>_ep, :<b>_rate, :<b>_cap).  $bucket maps a name to
# { rate, capacity }; by default every bucket, in name order, or only @names.
sub bucket_defines
{
	my ($bucket, @names) = @_;
	@names = sort keys %$bucket unless @names;
	return map {
		("-D${_}_ep=$_",
		 "-D${_}_rate=$bucket->{$_}{rate}",
		 "-D${_}_cap=$bucket->{$_}{capacity}")
	} @names;
}

# Writes one take_script per bucket of $bucket (in name order, so pgbench
# numbers the scripts in that order) to "$dir/${run}_take_<bucket>" and
# returns the pgbench -f options; "file@weight" when the bucket has a weight.
# A fresh $run per pgbench run keeps the files apart.
sub script_opts
{
	my ($dir, $run, $bucket) = @_;
	my @opts;
	for my $b (sort keys %$bucket)
	{
		my $file = "$dir/${run}_take_$b";
		PostgreSQL::Test::Utils::append_to_file($file, take_script($b));
		my $w = $bucket->{$b}{weight};
		push @opts, '-f', (defined $w ? "$file\@$w" : $file);
	}
	return @opts;
}

# Reads pgbench's per-transaction logs (-l --log-prefix=$prefix, one file per
# thread; lines "client_id transaction_no time script_no time_epoch
# time_us"): how many log files, the transactions per script (an array of
# $nscripts counts, by pgbench's script number) and the span of the run, from
# the first transaction's start (first_start) to the last one's end
# (last_end; both undef without any line).  Demand per second is what tells a
# saturated limiter from a slow load generator.  Dies on a line it cannot
# read (a failed or skipped transaction has no latency).
sub pgbench_log_stats
{
	my ($prefix, $nscripts) = @_;
	my @per_script = (0) x $nscripts;
	my ($first_start, $last_end);
	my $logs = 0;
	for my $log (glob("$prefix.*"))
	{
		$logs++;
		open my $fh, '<', $log or die "cannot open $log: $!";
		while (my $line = <$fh>)
		{
			my ($client, $xact, $latency, $script, $sec, $usec) = split ' ', $line;
			die "unexpected pgbench log line in $log: $line"
			  unless defined $usec && $latency =~ /^\d+$/;
			my $end   = $sec + $usec / 1e6;
			my $start = $end - $latency / 1e6;
			$per_script[$script]++;
			$first_start = $start if !defined $first_start || $start < $first_start;
			$last_end    = $end   if !defined $last_end    || $end > $last_end;
		}
		close $fh;
	}
	return {
		logs        => $logs,
		per_script  => \@per_script,
		first_start => $first_start,
		last_end    => $last_end,
	};
}

# The pids whose parent is $ppid, from /proc: a postmaster's backends and
# auxiliary processes, to kill them all at once.
sub children_of
{
	my ($ppid) = @_;
	my @kids;
	opendir(my $dh, '/proc') or die "cannot read /proc: $!";
	for my $pid (grep { /^\d+$/ } readdir $dh)
	{
		open(my $fh, '<', "/proc/$pid/stat") or next;    # gone meanwhile
		my $stat = <$fh>;
		close $fh;
		next unless defined $stat;
		# pid (comm) state ppid ...: comm may hold spaces and parentheses
		my ($state, $parent) = $stat =~ /\)\s+(\S)\s+(\d+)/ or next;
		push @kids, $pid if $parent == $ppid;
	}
	closedir $dh;
	return @kids;
}

# Kills the whole server of $node at once, as a crash of every process
# would: SIGSTOP the postmaster (so it neither forks nor notices its children
# dying), SIGKILL its children, then the postmaster ($node->kill9, which
# also makes the Cluster forget its pid).  Nothing gets to shut down or flush
# anything.  Then waits until every killed process is gone and reaped: a
# leftover backend would still be attached to the shared memory, and a zombie
# postmaster still holds its pid, so a restart would take it for a live one
# and refuse to run.  Returns { postmaster => pid, children => [pids],
# killed => how many SIGKILLs were delivered, t_kill => Time::HiRes time just
# before the children were killed }.
sub kill_server
{
	my ($node) = @_;
	my $postmaster = $node->{_pid} or die 'no postmaster pid';
	kill 'STOP', $postmaster or die "cannot SIGSTOP postmaster $postmaster: $!";
	my @children = children_of($postmaster);
	my $t_kill   = Time::HiRes::time();
	my $killed   = kill 'KILL', @children;
	$node->kill9;
	my $deadline = Time::HiRes::time() + 30;
	while (grep { -e "/proc/$_" } $postmaster, @children)
	{
		die 'killed server processes are still alive after 30 s'
		  if Time::HiRes::time() > $deadline;
		Time::HiRes::sleep(0.01);
	}
	return {
		postmaster => $postmaster,
		children   => \@children,
		killed     => $killed,
		t_kill     => $t_kill,
	};
}

# The sliding-window bound, checked over every pair of grants at once: the
# maximum over pairs i < j (by grant time t) of (j - i) - rate*(t_j - t_i),
# which the tests compare to the capacity (001_load.pl derives why).  It is
# max_j (n_j - rate*t_j) + max_{i<j} (rate*t_i - n_i), with n the number of
# grants at or before t: one pass with a running max, in exact numeric
# arithmetic.  $from is a FROM item with a timestamptz column "at" (e.g.
# "grants WHERE endpoint = 'x'"); with $split (a timestamptz literal's
# contents), also the maximum over the pairs with t_i < $split <= t_j (0 when
# one side is empty; without $split, 0).  Returns ($excess, $cross_excess,
# the number of grants).
sub window_excess
{
	my ($node, $from, $rate, $split) = @_;
	my $cross = defined $split
	  ? qq{(SELECT max(hi) FROM d WHERE at >= '$split') + (SELECT max(lo1) FROM d WHERE at < '$split')}
	  : 'NULL';
	return query_row($node, qq{
WITH g AS (
  SELECT at, extract(epoch FROM at) AS t,
         count(*) OVER (ORDER BY at RANGE BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS n
  FROM $from),
d AS (
  SELECT at, n - $rate * t AS hi, $rate * t - n AS lo1,
         max($rate * t - n) OVER (ORDER BY t, n ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS lo
  FROM g)
SELECT coalesce(max(hi + lo), 0), coalesce($cross, 0), (SELECT count(*) FROM g) FROM d});
}

# The same bound for grants known only to lie in an interval: a grant
# stamped by its client or statement is somewhere between lo (before the
# take) and hi (after it), and a stamp taken late packs grants into a window
# they were not in.  This counts, for every window [a, b] with a some grant's
# lo and b some grant's hi, only the grants certainly inside it (lo >= a and
# hi <= b), and returns the maximum over those windows of that count less
# rate*(b - a), with the number of grants: a token bucket keeps it within
# its capacity however late the stamps are, while a token handed out twice
# still shows.  $from is a FROM item with timestamptz columns "lo" and "hi".
# It looks at n^2/2 pairs: a few thousand grants.
sub window_excess_bracketed
{
	my ($node, $from, $rate) = @_;
	return query_row($node, qq{
SET work_mem = '256MB';
WITH g AS (
  SELECT extract(epoch FROM lo) AS lo, extract(epoch FROM hi) AS hi FROM $from),
w AS (
  SELECT s.lo AS a, g.hi AS b,
         count(*) OVER (PARTITION BY s.lo ORDER BY g.hi
                        RANGE BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS n
  FROM (SELECT DISTINCT lo FROM g) AS s JOIN g ON g.lo >= s.lo)
SELECT coalesce(max(n - $rate * (b - a)), 0), (SELECT count(*) FROM g) FROM w});
}

1;
