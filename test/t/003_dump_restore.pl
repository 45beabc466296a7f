# 003_dump_restore.pl — pg_dump / pg_restore of a database using ratebucket.
#
# Documented behaviour (README, "Backup, dump and restore"): pg_dump carries
# the rows of configured endpoints, with their state at dump time (the
# install script registers ratebucket.buckets with
# pg_extension_config_dump(..., 'WHERE conf_rate IS NOT NULL')); buckets
# created only by explicit takes are runtime state, are not dumped, and start
# full on their next take after a restore.
#
# A source node gets several configured endpoints (distinct rates and
# capacities, some taken from, one drained, one reconfigured, one taken with
# explicit limits, one with quotes/tab/non-ASCII, one of 1024 bytes, one
# configured then dropped) and several unconfigured runtime buckets.  It is
# dumped with pg_dump -Fc and restored with pg_restore into a database on a
# second, fresh node (as when moving to a new server).  Checks:
#
#   - the extension is there, at the source's version (= default_version),
#     with the same config-dump registration (extconfig, extcondition);
#   - every configured endpoint is there with its conf_rate / conf_capacity
#     (as configured, and as in the source), and its whole row is the
#     source's row (state at dump time: tokens, refilled_at, counters, ...);
#   - no runtime bucket is there, nor the dropped endpoint;
#   - restored tokens are sane: 0 <= tokens <= capacity, stored and now;
#   - the restored database works: configured takes (the drained bucket is
#     still empty: its state was carried, it did not come back full),
#     explicit takes (a runtime bucket starts full again), bucket_ready, the
#     "not configured" error, bucket_configure, bucket_expire, the status view;
#   - an in-flight cap is carried, the slots held at the dump are not;
#   - privileges: the extension's REVOKEs and the source's GRANTs to a worker
#     role are carried (the worker can take, cannot read the table, cannot
#     configure).

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

# ------------------------------------------------------------------ source --

my $source = start_node('source');

# Endpoints with stored limits.  Names are SQL string literals' contents
# (quotes doubled where needed) → [rate, capacity] as finally configured.
# quotes (doubled for SQL), a tab, and non-ASCII (UTF-8 bytes in this file)
my $odd = "https://hooks.example.com/it''s \"quoted\"\ttab/é/日本";
my %configured = (
	'cfg_a'         => [10,   20],
	'cfg_b_drained' => [0.01, 3],
	'cfg_c_idle'    => [1000, 5000],
	'cfg_reconf'    => [7,    14],
	'cfg_explicit'  => [2.5,  7.5],
	'rt_then_cfg'   => [3,    6],
	$odd            => [0.001, 1.5],
	'long'          => [1,    1],    # the endpoint is repeat('x', 1024)
);
my @runtime = ('rt_1', 'rt_2_drained', 'rt_3');

$source->safe_psql('postgres', qq{
CREATE ROLE worker LOGIN;
GRANT USAGE ON SCHEMA ratebucket TO worker;
GRANT EXECUTE ON FUNCTION
    ratebucket.bucket_take(text, float8, float8, float8),
    ratebucket.bucket_take(text, float8),
    ratebucket.bucket_ready(text, float8)
  TO worker;

-- runtime state only: explicit limits, never configured
SELECT ratebucket.bucket_take('rt_1', 10, 20);
SELECT ratebucket.bucket_take('rt_2_drained', 5, 5, 5);
SELECT ratebucket.bucket_take('rt_3', 1, 100, 50);

-- configured endpoints
SELECT ratebucket.bucket_configure('cfg_a', 10, 20);
SELECT ratebucket.bucket_take('cfg_a') FROM generate_series(1, 5);
SELECT ratebucket.bucket_configure('cfg_b_drained', 0.01, 3);
SELECT ratebucket.bucket_take('cfg_b_drained', 3);
SELECT ratebucket.bucket_configure('cfg_c_idle', 1000, 5000);
SELECT ratebucket.bucket_configure('cfg_reconf', 5, 10);
SELECT ratebucket.bucket_take('cfg_reconf', 4);
SELECT ratebucket.bucket_configure('cfg_reconf', 7, 14);
SELECT ratebucket.bucket_configure('cfg_explicit', 2.5, 7.5);
SELECT ratebucket.bucket_take('cfg_explicit', 50, 60, 5);    -- explicit limits on a configured endpoint (capped by it)
SELECT ratebucket.bucket_take('rt_then_cfg', 3, 6, 2);
SELECT ratebucket.bucket_configure('rt_then_cfg', 3, 6);
SELECT ratebucket.bucket_configure('$odd', 0.001, 1.5);
SELECT ratebucket.bucket_take('$odd', 1);
SELECT ratebucket.bucket_configure(repeat('x', 1024), 1, 1);
SELECT ratebucket.bucket_configure('cfg_dropped', 1, 1);
SELECT ratebucket.bucket_drop('cfg_dropped');
-- An in-flight cap (configuration) with slots held (runtime state).
SELECT ratebucket.inflight_configure('acct:dump', 4, '90 seconds');
SELECT ratebucket.inflight_acquire('acct:dump', 2);
});

# A configured endpoint's name as SQL, for the queries below.
sub ep_sql
{
	my ($name) = @_;
	return $name eq 'long' ? q{repeat('x', 1024)} : "'$name'";
}

# The worker can take on the source (so the check on the target means
# something).
is( $source->safe_psql('postgres',
		q{SET ROLE worker; SELECT allowed FROM ratebucket.bucket_take('cfg_c_idle')}),
	't', 'source: the worker role can take');

# Every column of a bucket row, as text; endpoints of 1024 bytes shortened.
my $row_sql = q{
SELECT CASE WHEN octet_length(endpoint) > 100
            THEN left(endpoint, 10) || '...(' || octet_length(endpoint) || ' bytes)'
            ELSE endpoint END,
       rate, capacity, tokens, refilled_at, conf_rate, conf_capacity,
       configured_at, created_at, last_granted_at, takes_granted, tokens_granted
FROM ratebucket.buckets
WHERE conf_rate IS NOT NULL
ORDER BY endpoint};

my $src_count_all = $source->safe_psql('postgres', 'SELECT count(*) FROM ratebucket.buckets');
my $src_runtime = $source->safe_psql('postgres',
	q{SELECT string_agg(endpoint, ',' ORDER BY endpoint) FROM ratebucket.buckets WHERE conf_rate IS NULL});
is($src_runtime, join(',', sort @runtime),
	'source: the runtime buckets exist (unconfigured, from explicit takes)');
is($src_count_all, scalar(keys %configured) + scalar(@runtime),
	"source: $src_count_all buckets in all (configured + runtime; the dropped one is gone)");

# ------------------------------------------------------------------- dump --

my $dump = $source->basedir . '/ratebucket.dump';
$source->command_ok(
	[ 'pg_dump', '-Fc', '--no-sync', '-f', $dump, '-d', 'postgres' ],
	'pg_dump -Fc of the source database');

my $src_rows = $source->safe_psql('postgres', $row_sql);
my $src_ext = $source->safe_psql('postgres', q{
SELECT e.extversion, e.extconfig::regclass[]::text, e.extcondition::text, a.default_version
FROM pg_extension e JOIN pg_available_extensions a ON a.name = e.extname
WHERE e.extname = 'ratebucket'});

# The archive holds the extension and the data of its config table.
my ($toc, $toc_err) = ('', '');
IPC::Run::run([ 'pg_restore', '-l', $dump ], '>', \$toc, '2>', \$toc_err)
  or die "pg_restore -l failed: $toc_err";
like($toc, qr/EXTENSION - ratebucket\b/, 'dump: has the extension');
like($toc, qr/TABLE DATA ratebucket buckets\b/, 'dump: has the data of ratebucket.buckets');

# ---------------------------------------------------------------- restore --

# No extension: the restore creates it.
my $target = new_node('target');
$target->start;
# Roles are global objects, not in a database dump (pg_dumpall -g would
# carry them): create the worker role first, as a migration would.
$target->safe_psql('postgres', 'CREATE ROLE worker LOGIN; CREATE DATABASE restored');

$target->command_checks_all(
	[
		'pg_restore', '--exit-on-error', '--single-transaction',
		'-d', 'restored', $dump
	],
	0,
	[qr/^$/],
	[qr/^$/],
	'pg_restore into a new database on a fresh node: no error, no warning');

sub tq
{
	my ($sql) = @_;
	return $target->safe_psql('restored', $sql);
}

# ---------------------------------------------------------------- checks --

is( tq(q{
SELECT e.extversion, e.extconfig::regclass[]::text, e.extcondition::text, a.default_version
FROM pg_extension e JOIN pg_available_extensions a ON a.name = e.extname
WHERE e.extname = 'ratebucket'}),
	$src_ext,
	"restored: extension version, config table and dump condition as in the source ($src_ext)");
my ($ver, undef, $cond, $default) = split /\|/, $src_ext;
is($ver, $default, "the version ($ver) is the control file's default_version");
like($cond, qr/conf_rate IS NOT NULL/, "the dump condition is the documented one ($cond)");

is(tq($row_sql), $src_rows,
	'restored: every configured bucket row is the source row, column for column (state at dump time)');

for my $name (sort keys %configured)
{
	my ($rate, $cap) = @{ $configured{$name} };
	my $ep = ep_sql($name);
	is( tq(qq{SELECT conf_rate = $rate AND conf_capacity = $cap AND configured_at IS NOT NULL
FROM ratebucket.buckets WHERE endpoint = $ep}),
		't', "restored: configured endpoint $name has conf_rate $rate, conf_capacity $cap");
}
is( tq(q{SELECT count(*) FROM ratebucket.buckets WHERE conf_rate IS NOT NULL}),
	scalar(keys %configured),
	'restored: exactly the configured endpoints, no more');
is(tq(q{SELECT count(*) FROM ratebucket.buckets WHERE conf_rate IS NULL}),
	0, 'restored: no unconfigured (runtime) bucket');
for my $rt (@runtime, 'cfg_dropped')
{
	is(tq(qq{SELECT count(*) FROM ratebucket.buckets WHERE endpoint = '$rt'}),
		0, "restored: $rt is not there");
}

# Tokens are sane, as stored and as the status view sees them now.
is( tq(q{
SELECT count(*) FROM ratebucket.buckets b JOIN ratebucket.bucket_status s USING (endpoint)
WHERE b.tokens >= 0 AND b.tokens <= b.capacity
  AND s.tokens >= 0 AND s.tokens <= s.capacity
  AND b.refilled_at <= clock_timestamp()}),
	scalar(keys %configured),
	'restored: 0 <= tokens <= capacity for every bucket, stored and now');
is( tq(q{SELECT count(*) FROM pg_constraint WHERE conrelid = 'ratebucket.buckets'::regclass}),
	$source->safe_psql('postgres',
		q{SELECT count(*) FROM pg_constraint WHERE conrelid = 'ratebucket.buckets'::regclass}),
	'restored: the table has its constraints');

# --- the restored database works ---

# Configured take: cfg_a had 20 - 5 tokens (plus refill) at the dump.
my ($allowed, $remaining, $wait) =
  split /\|/, tq(q{SELECT * FROM ratebucket.bucket_take('cfg_a')});
ok($allowed eq 't' && $remaining >= 0 && $remaining <= 19 && $wait == 0,
	"restored: configured take on cfg_a granted (remaining $remaining)");

# The drained bucket (rate 0.01/s) is still empty: its state was carried.
($allowed, $remaining, $wait) =
  split /\|/, tq(q{SELECT * FROM ratebucket.bucket_take('cfg_b_drained')});
ok($allowed eq 'f' && $remaining < 1 && $wait > 0,
	"restored: the drained configured bucket is still empty: refused, wait $wait s (it did not come back full)");
is(tq(q{SELECT ratebucket.bucket_ready('cfg_b_drained')}),
	'f', 'restored: bucket_ready says false for the drained bucket');
is(tq(q{SELECT ratebucket.bucket_ready('cfg_c_idle', 5000)}),
	't', 'restored: bucket_ready says true for the full one');

# Explicit limits: the runtime buckets start full again (documented).
is(tq(q{SELECT allowed, remaining FROM ratebucket.bucket_take('rt_2_drained', 5, 5, 5)}),
	't|0', 'restored: rt_2_drained (drained in the source) starts full: 5 of 5 granted');
is(tq(q{SELECT allowed, remaining FROM ratebucket.bucket_take('rt_new', 10, 20)}),
	't|19', 'restored: explicit take on a new endpoint');
# The configured endpoint's row remembers explicit limits; a configured take
# uses the configuration again.
is(tq(q{SELECT allowed FROM ratebucket.bucket_take('cfg_explicit', 50, 60, 1)}),
	't', 'restored: explicit take on a configured endpoint');
is(tq(qq{SELECT allowed FROM ratebucket.bucket_take(${\ ep_sql($odd)}, 1)}),
	'f', 'restored: the odd-named endpoint (0.001/s, 0.5 token at the dump: 500 s from a whole one) is found and still empty');

# A runtime endpoint is not configured after the restore.
my ($rc, $out, $err) = $target->psql('restored',
	q{SELECT ratebucket.bucket_take('rt_1')},
	extra_params => [ '-v', 'VERBOSITY=verbose' ]);
ok($rc != 0 && $err =~ /42704/,
	'restored: configured take on runtime endpoint rt_1 is "not configured" (42704)')
  or diag($err);

# Administration.
tq(q{SELECT ratebucket.bucket_configure('cfg_new', 4, 8)});
is(tq(q{SELECT allowed, remaining FROM ratebucket.bucket_take('cfg_new', 8)}),
	't|0', 'restored: bucket_configure, then a configured take');
is(tq(q{SELECT ratebucket.bucket_expire('0 s') >= 0}), 't', 'restored: bucket_expire runs');
is( tq(q{SELECT count(*) FILTER (WHERE configured), count(*) FILTER (WHERE NOT configured)
FROM ratebucket.bucket_status}),
	(scalar(keys %configured) + 1) . '|'
	  . tq(q{SELECT count(*) FROM ratebucket.buckets WHERE conf_rate IS NULL}),
	'restored: the status view shows every bucket');

# In-flight caps: the cap is configuration and comes back; the slots held
# at the dump were runtime state and do not.
is(tq(q{SELECT cap || ' ' || lease || ' ' || in_flight FROM ratebucket.inflight_status
		WHERE key = 'acct:dump'}),
	'4 00:01:30 0', 'restored: the in-flight cap, without the slots held at the dump');
is(tq(q{SELECT cardinality(ratebucket.inflight_acquire('acct:dump', 5))}), '4',
	'restored: inflight_acquire gets the whole cap');

# Privileges: the extension's REVOKEs and the dump's GRANTs.
($rc, $out, $err) = $target->psql('restored',
	q{SET ROLE worker; SELECT allowed FROM ratebucket.bucket_take('cfg_c_idle')});
ok($rc == 0 && $out eq 't', 'restored: the worker role can take (its GRANTs were carried)')
  or diag($err);
($rc, $out, $err) = $target->psql('restored',
	q{SET ROLE worker; SELECT count(*) FROM ratebucket.buckets});
ok($rc != 0 && $err =~ /permission denied/,
	'restored: the worker cannot read the bucket table') or diag($err);
($rc, $out, $err) = $target->psql('restored',
	q{SET ROLE worker; SELECT ratebucket.bucket_configure('cfg_a', 1e6, 1e6)});
ok($rc != 0 && $err =~ /permission denied/,
	'restored: the worker cannot configure (not granted)') or diag($err);
($rc, $out, $err) = $target->psql('restored',
	q{CREATE ROLE nobody; SET ROLE nobody; SELECT ratebucket.bucket_ready('cfg_a')});
ok($rc != 0 && $err =~ /permission denied/,
	'restored: a role without grants cannot call the functions (REVOKE FROM PUBLIC carried)') or diag($err);

note("source: $src_count_all buckets (" . scalar(keys %configured) . ' configured, ' . scalar(@runtime)
	  . " runtime); extension $src_ext");
note('dump: ' . (-s $dump) . ' bytes');

$source->stop;
$target->stop;
note(sprintf('003_dump_restore.pl total runtime %.1f s', Time::HiRes::time() - $t_start));

done_testing();
