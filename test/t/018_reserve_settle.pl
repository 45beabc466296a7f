# 018_reserve_settle.pl — a refill of a token reserve settles in a callback
# that runs once its commit is visible to others: a write of the row that
# lands in between (a bucket_reset) must find out that the refill leased
# the row's refill, and drain the reserve, rather than let the refill
# settle its lease over the reset row (row and reserve would then refill at
# once, each at the rate).
#
# The gap is held open: gdb stops the refilling backend in ratebucket's
# transaction callback, at the commit (after the commit is visible, before
# the callback settles anything), another session resets the row, and the
# backend goes on.  Then one client takes as fast as it can for 3 s: the
# grants from the reset on stay within rate*T + capacity.
#
# Needs gdb and a platform whose calling convention it reads (x86-64);
# skipped, saying so, without them or when the system refuses to let gdb
# attach to the server's processes.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use File::Spec;
use IPC::Run ();
use Time::HiRes ();

use lib 'test/perl';
use RatebucketTest;

my $gdb = `command -v gdb 2>/dev/null`;
chomp $gdb;
plan skip_all => 'gdb is not installed' unless $gdb;
plan skip_all => 'the breakpoint reads x86-64 registers'
  unless `uname -m` =~ /^x86_64/;

my ($rate, $cap, $lease) = (10, 20, 2);
my $node = start_node('settle',
	conf => "shared_preload_libraries = 'ratebucket'\n"
	  . "ratebucket.reserve_lease = '${lease}s'\n");
$node->safe_psql('postgres', qq{
SELECT ratebucket.bucket_configure('race', $rate, $cap);
SELECT ratebucket.bucket_reserve('race', $cap);
});

my $timeout = IPC::Run::timeout($PostgreSQL::Test::Utils::timeout_default);
my ($in, $out, $err) = ('', '', '');
my $refiller = IPC::Run::start(
	[ 'psql', '-X', '-A', '-t', '-v', 'ON_ERROR_STOP=1', '-d',
		$node->connstr('postgres') ],
	'<', \$in, '>', \$out, '2>', \$err, $timeout);
$in .= "SELECT pg_backend_pid();\n";
$refiller->pump until $out =~ /^(\d+)$/m;
my $pid = $1;
$out = '';

# Stop the backend at the entry of rb_reserve_xact for XACT_EVENT_COMMIT
# (0, its first argument): the commit is then visible, and nothing of it
# settled.
my $dir = PostgreSQL::Test::Utils::tempdir;
my ($ready, $hit, $go) = map { File::Spec->catfile($dir, $_) } qw(ready hit go);
my $gdb_out = '';
my $debugger = IPC::Run::start(
	[ $gdb, '-nx', '-batch', '-p', $pid,
		'-ex', 'break *rb_reserve_xact if $rdi == 0',
		'-ex', "shell touch $ready",
		'-ex', 'continue',
		'-ex', "shell touch $hit",
		'-ex', "shell while [ ! -e $go ]; do sleep 0.05; done",
		'-ex', 'detach',
		'-ex', 'quit' ],
	'>', \$gdb_out, '2>&1');

sub wait_for_file
{
	my ($file) = @_;
	my $deadline = Time::HiRes::time() + $PostgreSQL::Test::Utils::timeout_default;
	while (!-e $file)
	{
		return 0 if Time::HiRes::time() > $deadline || !$debugger->pumpable;
		Time::HiRes::sleep(0.05);
		$debugger->pump_nb;
		$refiller->pump_nb;		# hands psql what it is to send
	}
	return 1;
}

if (!wait_for_file($ready) || $gdb_out !~ /Breakpoint 1 at/)
{
	$debugger->kill_kill;
	note($gdb_out);
	plan skip_all => 'gdb could not attach to the backend, or set the breakpoint';
}

# The first take of the endpoint goes through the row and leaves it half a
# token: it moves no token to the reserve, but leases the row's refill to it.
$in .= "SELECT allowed FROM ratebucket.bucket_take('race', 19.5);\n";
ok(wait_for_file($hit), 'the refilling take stopped at its commit, in the callback')
  or diag($gdb_out);

# In the gap: the row is reset (full, refilling from now on), and a
# claim's batch takes what it holds (a batch moves nothing to the reserve
# and leases nothing: the row refills from the reset on).
my ($reset_at, $reset) = query_row($node, q{
SELECT extract(epoch FROM clock_timestamp()), ratebucket.bucket_reset('race');});
is($reset, 't', 'the row was reset while the refill had not settled');
my ($batch) = query_row($node, q{
SELECT sum(granted) FROM ratebucket.bucket_take_batch(
	ARRAY[ROW(ARRAY['race'], 20, NULL)::ratebucket.batch_request]);});

open my $fh, '>', $go or die "cannot create $go: $!";
close $fh;
$refiller->pump until $out =~ /^t$/m;
$debugger->finish;
is($out, "t\n", 'the refilling take was granted');
$out = '';

# 1.5 s later, within the refill's lease, the session that refilled the
# reserve (it knows it, and draws from it first) takes 40 times.
Time::HiRes::sleep(1.5);
$in .= "SELECT allowed FROM ratebucket.bucket_take('race');\n" x 40
  . "SELECT 'done';\n";
$refiller->pump until $out =~ /^done$/m;
$in .= "\\q\n";
$refiller->finish;
my $taken = () = $out =~ /^t$/mg;
my ($span) = query_row($node, qq{SELECT extract(epoch FROM clock_timestamp()) - $reset_at});

# Row and reserve refill at the rate together, never each at it: from the
# reset on, at most rate*T + capacity.
my $granted = $batch + $taken;
my $bound = $cap + $rate * $span;
ok($granted <= $bound + 1,
	sprintf('%d + %d grants in the %.2f s from the reset on: within rate*T + capacity = %.1f (1 of slack)',
		$batch, $taken, $span, $bound));
ok($granted >= 0.8 * $bound,
	sprintf('and they reach most of it (%.1f): the takes were not starved', $bound));

$node->stop;
done_testing();
