# 017_reserve.pl — token reserves in shared memory (bucket_reserve): one
# hot endpoint's takes drawn without a row write, the bound still exact.
#
#   Not preloaded     bucket_reserve says why it cannot (55000), and changes
#                     nothing.
#   Draws             with the library preloaded, the first take refills the
#                     reserve a batch at a time; the next takes draw from it
#                     and leave the row as it was (same xmin); a take that
#                     rolls back, or whose savepoint does, gives its token
#                     back; bad input gets its SQLSTATE and changes nothing.
#   Lease             a refill moves the row's refill time ahead and the
#                     reserve refills meanwhile, at the rate of the takes
#                     that filled it (a take's own, if it gives limits), up
#                     to the capacity in force (a burst the destination
#                     published); after a reset, the reserve knows its row
#                     from the next refill on, whatever the earlier lease.
#   Interleavings     the isolation specs of test/isolation/reserve, run
#                     against this preloaded server.
#   Feedback          a 429 empties the reserve at once, and the next take is
#                     refused with the cooldown's exact wait.
#   Saturating load   24 clients take far more than 400/s (burst 40, batch
#                     10), 1 take in 7 rolls back: no window holds more than
#                     40 above 400/s of the grants certainly in it (each
#                     stamped before and after its take), at least 95% of
#                     the bound is granted, most takes were draws.
#   Cancelled wait    a refill whose wait for a synchronous standby is
#                     cancelled commits locally, and its tokens are dropped.
#   Crash             with synchronous_commit = off, psql clients count the
#                     grants they were told of; the server is SIGKILLed mid
#                     load and restarted, the reserve is empty, and the grants
#                     the clients saw, both sides of the crash together, keep
#                     the bound over every window (counting, as above, the
#                     grants certainly in it).  So do the grants of a
#                     bucket_take_batch and a bucket_take_all of a reserve
#                     endpoint right before a kill.
#   Promotion         the same across the promotion of a synchronous standby
#                     (synchronous_commit = off on the primary: the takes
#                     through the row raise it themselves).
#
# Figures are printed with note(): run prove with -v to see them.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use File::Basename qw(basename dirname);
use File::Spec;
use IPC::Run ();
use Time::HiRes ();

use lib 'test/perl';
use RatebucketTest;

# ------------------------------------------------------- not preloaded --
my $node = start_node('reserve',
	conf => "max_connections = 40\nsynchronous_commit = off\n");
# 'hot' refills at 1/s: its reserve's tokens stay drawable while the
# checks below run (a row that refills past capacity less the reserve
# takes them back), and its lease adds less than a token to them (what the
# checks show is floored).
$node->safe_psql('postgres', q{SELECT ratebucket.bucket_configure('hot', 1, 200)});
my ($ret, $out, $err) = $node->psql('postgres', q{
\set VERBOSITY verbose
SELECT ratebucket.bucket_reserve('hot', 10)});
like($err, qr/55000: token reserves are not available on this server/,
	'not preloaded: bucket_reserve refuses with 55000');
like($err, qr/shared_preload_libraries/, 'not preloaded: the hint names shared_preload_libraries');
is($node->safe_psql('postgres', q{SELECT reserve IS NULL FROM ratebucket.buckets WHERE endpoint = 'hot'}),
	't', 'not preloaded: the row is unchanged');
is($node->safe_psql('postgres', q{SELECT count(*) FROM ratebucket.bucket_reserves()}),
	'0', 'not preloaded: no reserve is listed');

$node->append_conf('postgresql.conf', "shared_preload_libraries = 'ratebucket'\nratebucket.reserves = 64\n");
$node->restart;
is($node->safe_psql('postgres', 'SHOW ratebucket.reserves'), '64',
	'preloaded: ratebucket.reserves is read from postgresql.conf');

# ---------------------------------------------------------------- draws --
is($node->safe_psql('postgres', q{SELECT ratebucket.bucket_reserve('hot', 50) IS NULL}),
	't', 'preloaded: bucket_reserve gives the endpoint a reserve (it had none)');
is($node->safe_psql('postgres', q{SELECT allowed, remaining FROM ratebucket.bucket_take('hot', 100)}),
	't|50', 'the first take goes through the row and moves a batch of 50 to the reserve');
is($node->safe_psql('postgres', q{SELECT floor(tokens), pending, drawn, batch, refills FROM ratebucket.bucket_reserves()}),
	'50|0|0|50|1', 'the reserve holds the batch, committed');
my $xmin = $node->safe_psql('postgres', q{SELECT xmin FROM ratebucket.buckets WHERE endpoint = 'hot'});
is($node->safe_psql('postgres',
		q{SELECT allowed, floor(remaining) FROM ratebucket.bucket_take('hot');} x 5),
	"t|49\nt|48\nt|47\nt|46\nt|45", 'five takes draw from the reserve');
is($node->safe_psql('postgres', q{SELECT xmin FROM ratebucket.buckets WHERE endpoint = 'hot'}),
	$xmin, 'the draws left the row as it was');
is($node->safe_psql('postgres', q{
BEGIN;
SELECT allowed FROM ratebucket.bucket_take('hot');
SELECT drawn FROM ratebucket.bucket_reserves();
ROLLBACK;
SELECT floor(tokens) || ' ' || drawn || ' ' || draws FROM ratebucket.bucket_reserves();}),
	"t\n1\n45 0 5", 'a take that rolls back is drawn until then, and its token goes back');
is($node->safe_psql('postgres', q{
BEGIN;
SAVEPOINT a;
SELECT allowed FROM ratebucket.bucket_take('hot');
ROLLBACK TO a;
SELECT allowed FROM ratebucket.bucket_take('hot');
COMMIT;
SELECT floor(tokens) || ' ' || drawn || ' ' || draws FROM ratebucket.bucket_reserves();}),
	"t\nt\n44 0 6", 'a rolled-back savepoint gives its draw back, the committed one is spent');

($ret, $out, $err) = $node->psql('postgres', q{
\set VERBOSITY verbose
BEGIN READ ONLY;
SELECT allowed FROM ratebucket.bucket_take('hot');});
like($err, qr/ERROR:  25006:/, 'a take in a read-only transaction is refused (25006), reserve or not');
is($node->safe_psql('postgres', q{SELECT floor(tokens) || ' ' || drawn FROM ratebucket.bucket_reserves()}),
	'44 0', 'and draws nothing');

# An endpoint idle beside a full reserve: its row refills meanwhile, and
# the reserve lets go of what would take both together past the capacity,
# so a burst gets no more than the capacity (and what accrues at 10/s while
# it runs), whether it starts from the row (another session) or from the
# reserve (the session that filled it).  The first take leaves 9 in the
# row and 10 in the reserve; 1.5 s idle brings the row alone back to 20.
foreach my $case (['idle_row', 'another session', 0], ['idle_draw', 'the same session', 1])
{
	my ($endpoint, $how, $same_session) = @$case;
	my $take = qq{SELECT allowed, extract(epoch FROM statement_timestamp()), extract(epoch FROM clock_timestamp()) FROM ratebucket.bucket_take('$endpoint');};
	my $setup = qq{
SELECT ratebucket.bucket_configure('$endpoint', 10, 20);
SELECT ratebucket.bucket_reserve('$endpoint', 10);
SELECT allowed FROM ratebucket.bucket_take('$endpoint');};
	my $out;
	if ($same_session)
	{
		$out = $node->safe_psql('postgres', $setup . q{SELECT pg_sleep(1.5);} . ($take x 60));
	}
	else
	{
		$node->safe_psql('postgres', $setup);
		Time::HiRes::sleep(1.5);
		$out = $node->safe_psql('postgres', $take x 60);
	}
	my @burst = grep { /^[tf]\|/ } split /\n/, $out;
	my $granted = grep { /^t\|/ } @burst;
	my $span = (split /\|/, $burst[-1])[2] - (split /\|/, $burst[0])[1];
	my $bound = 20 + 10 * $span;
	ok(@burst == 60 && $granted >= 19 && $granted <= $bound + 1e-6,
		sprintf('after an idle spell, a burst from %s gets %d: within the capacity and %.3f s of refill (%.2f)',
			$how, $granted, $span, $bound));
	$node->safe_psql('postgres', qq{SELECT ratebucket.bucket_reserve('$endpoint', NULL)});
}

# ---------------------------------------------------------------- lease --
# A refill leases the row's refill to the reserve, for
# ratebucket.reserve_lease (1 s here): the row's refill time moves ahead,
# the row refills nothing until then, and the reserve refills at the rate
# instead, up to what the row lacks below the capacity.
sub set_lease
{
	my ($value) = @_;
	$node->safe_psql('postgres', ($value eq 'default'
		? q{ALTER SYSTEM RESET ratebucket.reserve_lease}
		: qq{ALTER SYSTEM SET ratebucket.reserve_lease = '$value'}) . q{;
SELECT pg_reload_conf()});
	my $want = $value eq 'default' ? '50ms' : $value;
	$node->poll_query_until('postgres',
		qq{SELECT current_setting('ratebucket.reserve_lease') = '$want'})
	  or die "ratebucket.reserve_lease did not become $want";
}
set_lease('1s');

# A bucket that stays full: 10 of its 1000 tokens in the reserve, and the
# row, at 1000/s, would have its token back within a millisecond.  Leased,
# the row stands still and the reserve's tokens stay drawable.
$node->safe_psql('postgres', q{
SELECT ratebucket.bucket_configure('full', 1000, 1000);
SELECT ratebucket.bucket_reserve('full', 10);
SELECT allowed FROM ratebucket.bucket_take('full');});
my ($lease_left) = query_row($node, q{SELECT extract(epoch FROM refilled_at - clock_timestamp()) FROM ratebucket.buckets WHERE endpoint = 'full'});
ok($lease_left > 0.5 && $lease_left <= 1.0,
	"a refill moves the row's refill time ahead by the lease ($lease_left s left)");
$xmin = $node->safe_psql('postgres', q{SELECT xmin FROM ratebucket.buckets WHERE endpoint = 'full'});
Time::HiRes::sleep(0.2);
is($node->safe_psql('postgres', q{
SELECT string_agg(CASE WHEN (t).allowed THEN 't' ELSE 'f' END, '')
FROM (SELECT ratebucket.bucket_take('full') AS t FROM generate_series(1, 5) OFFSET 0) AS s;
SELECT refills || ' ' || draws FROM ratebucket.bucket_reserves() WHERE endpoint = 'full';
SELECT xmin = '} . $xmin . q{' FROM ratebucket.buckets WHERE endpoint = 'full';}),
	"ttttt
1 5
t", 'in a full bucket the leased reserve still grants, 0.2 s later, without a row write');

# A bucket kept empty: the first take moves all 99 tokens left to the
# reserve; the row holds none and refills none during the lease, while the
# reserve refills at 100/s.  A take refused then is told when the reserve
# will have its token, not when the lease ends.
$node->safe_psql('postgres', q{
SELECT ratebucket.bucket_configure('empty', 100, 100);
SELECT ratebucket.bucket_reserve('empty', 100);
SELECT allowed FROM ratebucket.bucket_take('empty');});
$xmin = $node->safe_psql('postgres', q{SELECT xmin FROM ratebucket.buckets WHERE endpoint = 'empty'});
my ($drained, $refused_wait) = query_row($node, q{
SELECT count(*) FILTER (WHERE (t).allowed) >= 99, max((t).wait_seconds) FILTER (WHERE NOT (t).allowed)
FROM (SELECT ratebucket.bucket_take('empty') AS t FROM generate_series(1, 150) OFFSET 0) AS s});
my $refused_at = Time::HiRes::time();
ok($drained eq 't' && defined $refused_wait && $refused_wait > 0 && $refused_wait <= 0.0101,
	"a take refused by the leased row waits for the reserve's next token (at most " . ($refused_wait // 'none') . " s; one token is 0.01 s)");
Time::HiRes::sleep(0.3);
my ($regained, $row_tokens, $same_row) = query_row($node, q{
SELECT (SELECT count(*) FILTER (WHERE (t).allowed)
        FROM (SELECT ratebucket.bucket_take('empty') AS t FROM generate_series(1, 60) OFFSET 0) AS s),
       (SELECT floor(tokens) FROM ratebucket.bucket_status WHERE endpoint = 'empty'),
       (SELECT xmin = '} . $xmin . q{' FROM ratebucket.buckets WHERE endpoint = 'empty')});
my $refill_most = 1 + 100 * (Time::HiRes::time() - $refused_at);
ok($regained >= 25 && $regained <= $refill_most && $row_tokens == 0 && $same_row eq 't',
	sprintf('0.3 s later the reserve grants what 100/s refilled (%d, at most %.1f), the row still holds none and was not written',
		$regained, $refill_most));
$node->safe_psql('postgres', q{SELECT ratebucket.bucket_reserve(e, NULL) FROM unnest(ARRAY['full', 'empty']) AS e});

# A reserve filled by takes that give their own limits (10/s, burst 10, on
# an endpoint configured at 1000/s) refills at the take's rate, not at the
# configuration's.  Ten takes empty row and reserve (a refill of 5, then of
# the 3 the row has left); the next is refused and told when the reserve,
# refilling at 10/s, will have its token (at most 0.1 s, less what it
# refilled since: not the row's wait, past the lease's end), and is granted
# then, with the row still leased.
$node->safe_psql('postgres', q{
SELECT ratebucket.bucket_configure('own', 1000, 100);
SELECT ratebucket.bucket_reserve('own', 5);});
my @own = map { [ split /\|/ ] } split /\n/, $node->safe_psql('postgres',
	q{SELECT allowed, wait_seconds, extract(epoch FROM statement_timestamp()), extract(epoch FROM clock_timestamp()) FROM ratebucket.bucket_take('own', 10, 10);} x 15);
my $own_granted = grep { $_->[0] eq 't' } @own;
my ($own_refused) = grep { $_->[0] eq 'f' } @own;
my $own_span = $own[-1][3] - $own[0][2];
ok(@own == 15 && $own_granted >= 10 && $own_granted <= 10 + 10 * $own_span + 1e-6,
	sprintf('takes with their own limits (10/s, burst 10) get %d of 15 in %.3f s from row and reserve (at most %.2f)',
		$own_granted, $own_span, 10 + 10 * $own_span));
my $own_wait = $own_refused ? $own_refused->[1] : -1;
ok($own_wait >= 0.1 - $own_span - 1e-3 && $own_wait <= 0.1 + 1e-5,
	"the first take refused is told when the reserve, at the take's 10/s, has its next token ($own_wait s)");
Time::HiRes::sleep($own_wait) if $own_wait > 0;
is($node->safe_psql('postgres', q{
SELECT allowed FROM ratebucket.bucket_take('own', 10, 10);
SELECT draws > 8 FROM ratebucket.bucket_reserves() WHERE endpoint = 'own';
SELECT refilled_at > clock_timestamp() FROM ratebucket.buckets WHERE endpoint = 'own';}),
	"t\nt\nt", 'and after that wait the reserve grants it, the row still leased');
$node->safe_psql('postgres', q{SELECT ratebucket.bucket_reserve('own', NULL)});
set_lease('default');

# The same with the default lease, one client taking as fast as it can for
# 2 s: the grants it records stay within 10/s and a burst of 10 over every
# window, and take most of that bound.
$node->safe_psql('postgres', q{
SELECT ratebucket.bucket_configure('own_load', 1000, 100);
SELECT ratebucket.bucket_reserve('own_load', 5);
CREATE TABLE grants_own (lo timestamptz NOT NULL DEFAULT statement_timestamp(),
                         hi timestamptz NOT NULL DEFAULT clock_timestamp());});
$node->pgbench(
	'-n -M prepared -c 1 -j 1 -T 2',
	0,
	[ qr{number of failed transactions: 0 \(0\.000%\)} ],
	[ qr{^$} ],
	'one client takes with its own limits from an endpoint with a reserve: no error',
	{
		'001_take_own' => q{
INSERT INTO grants_own SELECT FROM ratebucket.bucket_take('own_load', 10, 10) WHERE allowed;
},
	},
	'postgres');
my ($own_excess, $own_recorded) = window_excess_bracketed($node, 'grants_own', 10);
my ($own_busy) = query_row($node, q{SELECT extract(epoch FROM max(hi) - min(lo)) FROM grants_own});
ok($own_excess <= 10 + 1 + 1e-6,
	sprintf('takes with their own limits: every window holds at most %.2f of the %d grants above 10/s (burst 10, 1 of slack)',
		$own_excess, $own_recorded));
ok($own_recorded >= 0.9 * (10 * $own_busy + 10),
	sprintf('and they get %d of the %.1f the bound allows over %.3f s', $own_recorded, 10 * $own_busy + 10, $own_busy));
$node->safe_psql('postgres', q{SELECT ratebucket.bucket_reserve('own_load', NULL)});

# 60 takes of $endpoint in one session, as after an idle spell: how many
# were made and granted, over how long, and the bound $r * span + $cap.
sub idle_burst
{
	my ($endpoint, $r, $cap) = @_;
	my $out = $node->safe_psql('postgres',
		qq{SELECT allowed, extract(epoch FROM statement_timestamp()), extract(epoch FROM clock_timestamp()) FROM ratebucket.bucket_take('$endpoint');} x 60);
	my @burst = grep { /^[tf]\|/ } split /\n/, $out;
	my $granted = grep { /^t\|/ } @burst;
	my $span = (split /\|/, $burst[-1])[2] - (split /\|/, $burst[0])[1];
	return (scalar @burst, $granted, $span, $cap + $r * $span);
}

# A burst the destination published (RateLimit-Policy 20;w=1: 20/s in
# bursts of 20, on an endpoint configured at 20/s with a capacity of 100)
# caps what a lease refills too: row and reserve hold at most the 20 in
# force together, whether the policy came before the refill or after it
# (then the reserve is not emptied: its 10 and the row's 5 fit in 20).
# With a lease of 2 s, after 1.8 s idle, a burst gets at most 20 and what
# 20/s refills while it runs.
set_lease('2s');
foreach my $case (['published_before', 'before the refill', 1], ['published_after', 'after it', 85])
{
	my ($endpoint, $when, $first) = @$case;
	my $observe = qq{
SELECT outcome FROM ratebucket.bucket_observe('$endpoint', 200, NULL, '{"RateLimit-Policy": "20;w=1"}');};
	my $take = qq{
SELECT allowed FROM ratebucket.bucket_take('$endpoint', $first);};
	$node->safe_psql('postgres', qq{
SELECT ratebucket.bucket_configure('$endpoint', 20, 100);
SELECT ratebucket.bucket_reserve('$endpoint', 10);} . ($first == 1 ? $observe . $take : $take . $observe));
	Time::HiRes::sleep(1.8);
	my ($n, $granted, $span, $bound) = idle_burst($endpoint, 20, 20);
	ok($n == 60 && $granted >= 19 && $granted <= $bound + 1e-6,
		sprintf('a burst of 20 published %s: after 1.8 s of a 2 s lease, a burst gets %d in %.3f s (at most %.2f)',
			$when, $granted, $span, $bound));
	$node->safe_psql('postgres', qq{SELECT ratebucket.bucket_reserve('$endpoint', NULL)});
}
set_lease('default');

# A reset empties the reserve, and the reserve then knows its row only from
# the next refill on, whatever the row's lease was before.  A refill under
# a lease of 10 s, then the lease shortened to 50 ms and the endpoint
# (10/s, burst 20, batch 10) reset: the next refill leases its row until
# 50 ms later, long before the first lease would have ended.  1.5 s later
# the row is full again, and the reserve, knowing it, has let go of its
# 10: a burst gets 20, not 30.
set_lease('10s');
$node->safe_psql('postgres', q{
SELECT ratebucket.bucket_configure('reset', 10, 20);
SELECT ratebucket.bucket_reserve('reset', 10);
SELECT allowed FROM ratebucket.bucket_take('reset');});
set_lease('default');
$node->safe_psql('postgres', q{
SELECT ratebucket.bucket_reset('reset');
SELECT allowed FROM ratebucket.bucket_take('reset');});
Time::HiRes::sleep(1.5);
{
	my ($n, $granted, $span, $bound) = idle_burst('reset', 10, 20);
	ok($n == 60 && $granted >= 19 && $granted <= $bound + 1e-6,
		sprintf('after a reset and a shorter lease, a burst 1.5 s after the next refill gets %d in %.3f s (at most %.2f)',
			$granted, $span, $bound));
	$node->safe_psql('postgres', q{SELECT ratebucket.bucket_reserve('reset', NULL)});
}

# bad input: its SQLSTATE, nothing changed
$node->safe_psql('postgres', q{
SELECT ratebucket.bucket_configure('quota', 10, 10);
SELECT ratebucket.bucket_configure_quota('quota', 100, 'day');
SELECT ratebucket.bucket_configure('striped', 100, 100);
SELECT ratebucket.bucket_stripe('striped', 4);
});
my $rows_sql = q{SELECT string_agg(endpoint || ':' || coalesce(reserve::text, '-') || ':' || tokens, ',' ORDER BY endpoint)
FROM ratebucket.buckets WHERE octet_length(endpoint) <= 1024};
my $rows_before = $node->safe_psql('postgres', $rows_sql);
for my $case (
	[ q{SELECT ratebucket.bucket_reserve('hot', 0)}, '22023', 'batch 0' ],
	[ q{SELECT ratebucket.bucket_reserve('hot', 201)}, '22023', 'a batch above the capacity' ],
	[ q{SELECT ratebucket.bucket_reserve('nobody', 5)}, '42704', 'an endpoint not configured' ],
	[ q{SELECT ratebucket.bucket_reserve('quota', 5)}, '0A000', 'a calendar quota' ],
	[ q{SELECT ratebucket.bucket_reserve('striped', 5)}, '55000', 'a striped endpoint' ],
	[ q{SELECT ratebucket.bucket_stripe('hot', 2)}, '55000', 'striping an endpoint with a reserve' ],
	[ q{SELECT ratebucket.bucket_reserve(repeat('x', 256), 5)}, '54000', 'an endpoint longer than 255 bytes' ])
{
	my ($sql, $state, $what) = @$case;
	($ret, $out, $err) = $node->psql('postgres', "\\set VERBOSITY verbose\n$sql");
	like($err, qr/ERROR:  $state:/, "$what: $state");
}
is($node->safe_psql('postgres', $rows_sql), $rows_before, 'the refused calls changed no row');

# ------------------------------------------------------- isolation specs --
# test/isolation/reserve: interleavings of draws, refills, rollbacks and a
# 429, on this preloaded server (the main isolation suite runs on a server
# that does not preload ratebucket).
{
	my $isolation = File::Spec->catfile(dirname(dirname($ENV{PG_REGRESS})),
		'isolation', 'pg_isolation_regress');
	my $outdir = $node->basedir . '/isolation_reserve';
	mkdir $outdir;
	$node->safe_psql('postgres', 'CREATE DATABASE iso_reserve');
	my @specs = map { basename($_, '.spec') } glob('test/isolation/reserve/specs/*.spec');
	my ($stdout, $stderr);
	my $ok = IPC::Run::run(
		[ $isolation, '--use-existing', '--host=' . $node->host, '--port=' . $node->port,
		  '--dbname=iso_reserve', '--inputdir=test/isolation/reserve',
		  "--outputdir=$outdir", @specs ],
		'>', \$stdout, '2>', \$stderr);
	ok($ok && @specs >= 2, 'isolation specs of the reserve pass: ' . join(' ', @specs))
	  or diag($stdout . $stderr . (-e "$outdir/regression.diffs" ? slurp_file("$outdir/regression.diffs") : ''));
}

# ------------------------------------------------------------- feedback --
is($node->safe_psql('postgres', q{
SELECT outcome FROM ratebucket.bucket_observe('hot', 429, '1');
SELECT tokens || ' ' || drains FROM ratebucket.bucket_reserves();}),
	"throttled\n0 1", 'a 429 empties the reserve at once');
my ($allowed, $wait) = query_row($node, q{SELECT allowed, wait_seconds FROM ratebucket.bucket_take('hot')});
# the cooldown's second, then one token at the lowered rate (0.7/s)
ok($allowed eq 'f' && $wait > 0.9 + 1 / 0.7 && $wait <= 1.0 + 1 / 0.7,
	"the next take is refused with the cooldown's wait ($wait s)");
is($node->safe_psql('postgres', q{SELECT ratebucket.bucket_reserve('hot', NULL) || ' ' || (SELECT count(*) FROM ratebucket.bucket_reserves())}),
	'50 0', 'bucket_reserve(NULL) takes the reserve away');
is($node->safe_psql('postgres', q{
SELECT ratebucket.bucket_configure('toquota', 100, 100);
SELECT ratebucket.bucket_reserve('toquota', 10);
SELECT allowed FROM ratebucket.bucket_take('toquota');
SELECT ratebucket.bucket_configure_quota('toquota', 1000, 'day');
SELECT coalesce(reserve::text, 'none') || ' ' || (SELECT count(*) FROM ratebucket.bucket_reserves() WHERE tokens > 0)
FROM ratebucket.buckets WHERE endpoint = 'toquota';}),
	"\n\nt\n\nnone 0", 'an endpoint made a calendar quota loses its reserve, emptied');

# ----------------------------------------------------- saturating load --
my ($rate, $capacity, $batch, $clients, $seconds) = (400, 40, 10, 24, 5);
$node->safe_psql('postgres', qq{
SELECT ratebucket.bucket_configure('load', $rate, $capacity);
SELECT ratebucket.bucket_reserve('load', $batch);
CREATE TABLE grants (lo timestamptz NOT NULL DEFAULT statement_timestamp(),
                     hi timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE SEQUENCE rolled_back;
});
$node->pgbench(
	"-n -M prepared -c $clients -j 2 -T $seconds",
	0,
	[ qr{number of failed transactions: 0 \(0\.000%\)} ],
	[ qr{^$} ],
	"$clients clients saturate one endpoint with a reserve: no error",
	{
		'001_take@12' => q{
INSERT INTO grants SELECT FROM ratebucket.bucket_take('load') WHERE allowed;
},
		'002_take_rollback@2' => q{
BEGIN;
SELECT nextval('rolled_back') FROM ratebucket.bucket_take('load') WHERE allowed;
ROLLBACK;
},
	},
	'postgres');
my ($recorded, $busy, $draws, $refills, $row_takes) = query_row($node, q{
SELECT (SELECT count(*) FROM grants),
       (SELECT extract(epoch FROM max(hi) - min(lo)) FROM grants),
       r.draws, r.refills, b.takes_granted
FROM ratebucket.bucket_reserves() AS r, ratebucket.buckets AS b
WHERE r.endpoint = 'load' AND b.endpoint = 'load'});
my ($excess) = window_excess_bracketed($node, 'grants', $rate);
ok($excess <= $capacity + 1 + 1e-6,
	sprintf('every window: at most %.2f grants certainly in it above %d/s (capacity %d, 1 of slack)',
		$excess, $rate, $capacity));
my $busy_bound = $rate * $busy + $capacity;
ok($recorded >= 0.95 * $busy_bound,
	sprintf('efficiency %.1f%% >= 95%% under saturating demand (%d of %.1f over %.3f s)',
		100 * $recorded / $busy_bound, $recorded, $busy_bound, $busy));
ok($draws > 0 && $refills > 0, "grants were drawn ($draws) and refilled ($refills)");
ok($draws <= $recorded, "committed draws ($draws) <= grants recorded ($recorded): rolled-back draws are not counted");
ok($node->safe_psql('postgres', 'SELECT is_called FROM rolled_back') eq 't', 'some takes rolled back');
ok($row_takes >= $refills, "the row counts its own takes and the draws it was told of ($row_takes)");

# -------------------------------------------- what clients were told of --
# $n psql clients, each running $takes takes of $ep, one line per grant:
# the epochs of its statement_timestamp (before the take) and of its
# clock_timestamp (after it), with ON_ERROR_STOP: a client whose server dies
# stops there and prints what it was told.
sub start_clients
{
	my ($target, $ep, $n, $takes) = @_;
	# a file, not stdin: a client whose server died reads no more of it
	my $script = $target->basedir . "/takes_${ep}_$takes.sql";
	PostgreSQL::Test::Utils::append_to_file($script,
		"SELECT extract(epoch FROM statement_timestamp()), extract(epoch FROM clock_timestamp()) FROM ratebucket.bucket_take('$ep') WHERE allowed;\n" x $takes)
	  unless -e $script;
	my @clients;
	for my $i (1 .. $n)
	{
		my %c = (out => '', err => '');
		$c{h} = IPC::Run::start(
			[ 'psql', '-X', '-A', '-t', '-q', '-v', 'ON_ERROR_STOP=1',
			  '-h', $target->host, '-p', $target->port, '-d', 'postgres', '-f', $script ],
			'<', \undef, '>', \$c{out}, '2>', \$c{err});
		push @clients, \%c;
	}
	return \@clients;
}

# Wait for the clients to end; the grants they printed.
sub finish_clients
{
	my ($clients) = @_;
	my @at;
	for my $c (@$clients)
	{
		$c->{h}->finish;
		push @at, grep { /^\d+(\.\d+)?\|\d+(\.\d+)?$/ } split /\n/, $c->{out};
	}
	return @at;
}

# The grants of @at into table $table of $target, and the window check.
sub check_told
{
	my ($target, $table, $r, $cap, $what, @at) = @_;
	$target->safe_psql('postgres', "CREATE TABLE $table (lo timestamptz NOT NULL, hi timestamptz NOT NULL);");
	$target->safe_psql('postgres',
		"INSERT INTO $table SELECT to_timestamp(split_part(x, '|', 1)::float8), to_timestamp(split_part(x, '|', 2)::float8)"
		  . " FROM unnest('{" . join(',', @at) . "}'::text[]) AS x;");
	my ($ex, $count) = window_excess_bracketed($target, $table, $r);
	ok($ex <= $cap + 1 + 1e-6,
		sprintf('%s: the %d grants clients were told of hold at most %.2f above %d/s in any window they are certainly in (capacity %d, 1 of slack)',
			$what, $count, $ex, $r, $cap));
	return $count;
}

# The SQL that configures an endpoint for burst_then_kill: 1/s, burst 200,
# a batch of 100, committed durably.
sub burst_setup
{
	my ($ep) = @_;
	return qq{
SET synchronous_commit = on;
SELECT ratebucket.bucket_configure('$ep', 1, 200);
SELECT ratebucket.bucket_reserve('$ep', 100);};
}

# A burst that ends in a kill: on a fresh endpoint (burst_setup) one take
# through the row moves 100 tokens to the reserve, and 100 draws follow in
# the same session, all told to the client; then $victim is SIGKILLed at
# once, within the walwriter's delay of the refill's commit.  Returns the
# grants told.
sub burst_then_kill
{
	my ($victim, $ep) = @_;
	my $out = $victim->safe_psql('postgres',
		"SELECT allowed FROM ratebucket.bucket_take('$ep');\n" x 101);
	kill_server($victim);
	return scalar grep { $_ eq 't' } split /\n/, $out;
}

# After burst_then_kill: every take $survivor still grants of $ep, and the
# check that both sides together stay within 1*T + 200, T from the
# configuration to now.
sub check_burst
{
	my ($survivor, $ep, $told, $what) = @_;
	my $out = $survivor->safe_psql('postgres',
		"SELECT allowed FROM ratebucket.bucket_take('$ep');\n" x 400);
	my $after = grep { $_ eq 't' } split /\n/, $out;
	my ($t) = query_row($survivor, qq{
SELECT extract(epoch FROM clock_timestamp() - configured_at) FROM ratebucket.buckets WHERE endpoint = '$ep'});
	ok($told + $after <= 200 + 1 * $t + 1e-6,
		sprintf('%s: %d grants told before, %d after: within 1*T + 200 = %.1f (a refill the %s lost would give its 100 again)',
			$what, $told, $after, 200 + $t, $what));
	return;
}

# ---------------------------------------------------------------- crash --
my ($c_rate, $c_cap, $c_batch) = (300, 60, 20);
$node->safe_psql('postgres', qq{
SELECT ratebucket.bucket_configure('crash', $c_rate, $c_cap);
SELECT ratebucket.bucket_reserve('crash', $c_batch);
});
my $before = start_clients($node, 'crash', 6, 200000);
Time::HiRes::sleep(1.5);
my ($draws_at_kill) = query_row($node, q{SELECT draws FROM ratebucket.bucket_reserves() WHERE endpoint = 'crash'});
kill_server($node);
my @told = finish_clients($before);
$node->start;
is($node->safe_psql('postgres', q{SELECT count(*) FROM ratebucket.bucket_reserves()}),
	'0', 'after the crash: every reserve is empty (gone with shared memory)');
my $after = start_clients($node, 'crash', 6, 3000);
push @told, finish_clients($after);
ok($draws_at_kill > 0, "draws were being made when the server was killed ($draws_at_kill)");
check_told($node, 'told_crash', $c_rate, $c_cap, 'crash (synchronous_commit = off)', @told);
$node->safe_psql('postgres', burst_setup('durable'));
my $burst = burst_then_kill($node, 'durable');
$node->start;
check_burst($node, 'durable', $burst, 'crash');

# The takes of a claim's batch (bucket_take_batch) and of several buckets at
# once (bucket_take_all) write a reserve endpoint's row as a take does, and
# commit as durably: 150 tokens granted each way, then a kill.  The
# walwriter sleeps 10 s meanwhile, so a commit left to it would be lost,
# and its 150 tokens granted again after the restart.
$node->safe_psql('postgres', burst_setup('batch') . burst_setup('all') . q{
ALTER SYSTEM SET wal_writer_delay = '10s';
SELECT pg_reload_conf();});
Time::HiRes::sleep(0.3);
my $granted = $node->safe_psql('postgres', q{
SELECT sum(granted) FROM ratebucket.bucket_take_batch(
	ARRAY[ROW(ARRAY['batch'], 150, NULL)::ratebucket.batch_request]);
SELECT CASE WHEN allowed THEN 150 ELSE 0 END
FROM ratebucket.bucket_take_all(ARRAY['all'], ARRAY[150::float8]);});
kill_server($node);
$node->start;
$node->safe_psql('postgres', q{ALTER SYSTEM RESET wal_writer_delay; SELECT pg_reload_conf();});
my @granted = split /\n/, $granted;
is("@granted", '150 150', 'bucket_take_batch and bucket_take_all granted 150 tokens each before the kill');
check_burst($node, 'batch', $granted[0], 'crash after bucket_take_batch');
check_burst($node, 'all', $granted[1], 'crash after bucket_take_all');
$node->stop;

# ------------------------------------------------------------ promotion --
my $primary = start_node('reserve_primary',
	init => { allows_streaming => 1 },
	conf => "max_connections = 30\nsynchronous_commit = off\nshared_preload_libraries = 'ratebucket'\n");
$primary->safe_psql('postgres', qq{
SELECT ratebucket.bucket_configure('failover', $c_rate, $c_cap);
SELECT ratebucket.bucket_reserve('failover', $c_batch);
} . burst_setup('durable'));
$primary->backup('b');
my $standby = PostgreSQL::Test::Cluster->new('reserve_standby');
$standby->init_from_backup($primary, 'b', has_streaming => 1);
$standby->append_conf('postgresql.conf', "synchronous_standby_names = ''\n");
$standby->start;
$primary->append_conf('postgresql.conf', "synchronous_standby_names = '*'\n");
$primary->reload;
$primary->poll_query_until('postgres',
	q{SELECT count(*) = 1 FROM pg_stat_replication WHERE sync_state = 'sync'})
  or die 'the standby never became synchronous';
$before = start_clients($primary, 'failover', 6, 200000);
Time::HiRes::sleep(1.5);
$burst = burst_then_kill($primary, 'durable');
@told = finish_clients($before);
my $told_primary = scalar @told;
$standby->promote;
$after = start_clients($standby, 'failover', 6, 3000);
push @told, finish_clients($after);
ok($told_primary > 0 && @told > $told_primary,
	sprintf('grants were told on the primary (%d) and on the promoted standby (%d)',
		$told_primary, @told - $told_primary));
check_told($standby, 'told_failover', $c_rate, $c_cap, 'promotion of a synchronous standby', @told);
check_burst($standby, 'durable', $burst, 'promotion');

# ------------------------------------------- a cancelled synchronous wait --
# A refill whose commit waits for a synchronous standby that never answers,
# cancelled: PostgreSQL commits it locally anyway (with a warning); its
# tokens must not become drawable, since a standby promoted then would
# still hold them in the row.  (On the promoted standby, a primary now.)
$standby->safe_psql('postgres', q{
SELECT ratebucket.bucket_configure('cancelled', 1, 200);
SELECT ratebucket.bucket_reserve('cancelled', 100);});
$standby->safe_psql('postgres', q{ALTER SYSTEM SET synchronous_standby_names = 'nobody'; SELECT pg_reload_conf();});
{
	my ($out_c, $err_c) = ('', '');
	my $h = IPC::Run::start(
		[ 'psql', '-X', '-A', '-t', '-h', $standby->host, '-p', $standby->port, '-d', 'postgres',
		  '-c', q{SELECT allowed FROM ratebucket.bucket_take('cancelled')} ],
		'<', \undef, '>', \$out_c, '2>', \$err_c);
	$standby->poll_query_until('postgres',
		q{SELECT count(pg_cancel_backend(pid)) > 0 FROM pg_stat_activity WHERE wait_event = 'SyncRep'})
	  or die 'the take never waited for the synchronous standby';
	$h->finish;
	like($err_c, qr/canceling wait for synchronous replication/,
		'a refill waiting for a synchronous standby is cancelled, and commits locally');
	is($out_c, "t\n", 'its take was granted');
}
$standby->safe_psql('postgres', q{ALTER SYSTEM RESET synchronous_standby_names; SELECT pg_reload_conf();});
is($standby->safe_psql('postgres', q{SELECT tokens || ' ' || pending FROM ratebucket.bucket_reserves() WHERE endpoint = 'cancelled'}),
	'0 0', 'the tokens of that refill are dropped, not drawable');

done_testing();
