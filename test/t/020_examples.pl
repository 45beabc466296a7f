# 020_examples.pl — the example workers of examples/ (Python with psycopg2,
# Node.js with pg) deliver a real queue over real HTTP.
#
# One cluster with ratebucket and ratebucket_queue, and the demo's
# destination simulator (demo/simulator.c) playing four destinations per
# worker, each with a limit of its own:
#
#   paced      configured 10/s, bursts of 1; accepts 20/s in bursts of 5
#   steady     configured 20/s, bursts of 10; accepts 40/s, answers in 300 ms
#              (so that a batch is in flight most of the time, SIGTERM's too)
#   throttled  configured 25/s, bursts of 10; accepts 10/s in bursts of 5,
#              429 with Retry-After in seconds
#   published  configured 40/s, bursts of 20; accepts 15/s, and says so in
#              its RateLimit-Policy (15;w=1) on every answer
#
# Each worker in turn (Python, then Node) starts on an empty queue and
# falls asleep.  paced's events arrive, and it has the queue to itself for
# PACED_SECONDS; then the others' arrive, 600 events in all.  After
# RUN_SECONDS more the worker gets a SIGTERM, and must finish and record
# the batch in hand.  A trigger on webhook_events logs every claim (the
# event, its attempt, the claim's transaction start, before its tokens
# were taken); the simulator logs every request it received.  The checks,
# per worker:
#
#   exit      it exited 0 after SIGTERM;
#   recorded  no event left 'sending', and every claim was recorded as one
#             attempt that reached its destination: claims = attempts =
#             requests received;
#   answers   per destination, events delivered (> 0) = events the
#             destination answered 2xx, and the 2xx and 429s ratebucket
#             observed = those the destination sent: the statuses reached
#             record_deliveries; throttled did answer 429s;
#   Retry-After  throttled's Retry-After (1 s) reached ratebucket: requests
#             went on more than 1 s after its first 429, where a 429
#             without it costs 20 s in this cluster (default_cooldown);
#   headers   published's RateLimit-Policy reached ratebucket (the bucket's
#             limit_factor is 15/40);
#   NOTIFY    the first request arrived within 2 s of the first insert,
#             though the idle worker sleeps up to 5 s: it woke on NOTIFY
#             webhook_events;
#   next_due  while paced had the queue to itself, at least half of its
#             rate x that time reached it: with a bucket of one token, the
#             worker's claims come up empty between tokens, and it sleeps
#             only as long as next_due() says;
#   bound     per destination, arrivals over any window T within
#             rate*(T + d) + capacity, d the longest from a claim (the
#             trigger's time) to its request's arrival, and 2 ms for the
#             two clocks that measures (demo/report.sql's check 5).
#
# The workers need python3 with psycopg2 (Debian: python3-psycopg2), node
# (18 or later) and the pg package installed in examples/node (npm ci
# --omit=dev); test/run provides them.  A worker whose needs are missing is
# skipped, saying why, unless EXAMPLES_REQUIRED=1 (test/run sets it), which
# makes that a failure.

use strict;
use warnings;

use IPC::Run ();
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes ();

use lib 'test/perl';
use RatebucketTest;

my $PACED_SECONDS = 1.2;    # paced alone
my $RUN_SECONDS = 3;        # then all four
# name => [configured rate, capacity, the simulator's options, events]
my %DEST = (
	paced     => [ 10, 1,  'rate=20 burst=5 mode=seconds', 100 ],
	steady    => [ 20, 10, 'rate=40 burst=40 mode=seconds delay_ms=300', 200 ],
	throttled => [ 25, 10, 'rate=10 burst=5 mode=seconds', 150 ],
	published => [ 40, 20, 'rate=15 burst=15 mode=ratelimit', 150 ],
);

# What each worker needs, and whether it is there.
sub runs
{
	my (@cmd) = @_;
	my ($out, $err);
	return eval { IPC::Run::run(\@cmd, '<', \undef, '>', \$out, '2>', \$err) };
}
my %missing;
$missing{python} = 'python3 with psycopg2 is not installed (Debian: python3-psycopg2)'
  unless runs('python3', '-c', 'import psycopg2');
if (!runs('node', '--version'))
{
	$missing{node} = 'node is not on PATH (Debian: nodejs)';
}
elsif (!runs('node', '-e', q{require.resolve('pg', { paths: ['examples/node'] })}))
{
	$missing{node} = 'the pg package is not installed in examples/node (npm ci --omit=dev there)';
}
my $required = ($ENV{EXAMPLES_REQUIRED} // '') eq '1';
if (!$required && $missing{python} && $missing{node})
{
	plan skip_all => "no example worker can run: $missing{python}; $missing{node}";
}

my $pg_config = $ENV{PG_CONFIG} || 'pg_config';
my (undef, $build_err) = run_command([ 'make', '-C', 'demo', 'simulator', "PG_CONFIG=$pg_config" ]);
ok(-x 'demo/simulator', 'the destination simulator built')
  or BAIL_OUT("make -C demo simulator failed: $build_err");

# A 429 that says nothing of when to come back costs 20 s here (1 s by
# default), so that one whose Retry-After (1 s) was lost shows.
my $node = start_node('examples', extensions => ['ratebucket_queue'],
	conf => "ratebucket.default_cooldown = '20s'\n");
my $user = $node->safe_psql('postgres', 'SELECT current_user');
my $work = PostgreSQL::Test::Utils::tempdir();
my $sim_port = PostgreSQL::Test::Cluster::get_free_port();
my @langs = ('python', 'node');
my @dests = sort keys %DEST;
# d is measured across two clocks, the database's (claims) and the
# simulator's (arrivals, put on the wall clock at its start): 2 ms for
# their drifting apart during the test (a fraction of a token here).
my $CLOCK_SLACK = 0.002;

sub url { my ($name) = @_; return "http://127.0.0.1:$sim_port/$name"; }

# The destinations (named <worker>-<destination>: each worker has its own
# four), their buckets, and the claim log.
open(my $conf, '>', "$work/simulator.conf") or die "cannot write $work/simulator.conf: $!";
my @rows;
for my $lang (@langs)
{
	for my $dest (@dests)
	{
		my ($rate, $capacity, $sim) = @{ $DEST{$dest} };
		print $conf "$lang-$dest $sim\n";
		push @rows, "('$lang', '$dest', '$lang-$dest', '" . url("$lang-$dest") . "', $rate, $capacity)";
	}
}
close($conf);
$node->safe_psql('postgres', q{
CREATE TABLE example_dests (lang text, dest text, name text, url text, rate float8, capacity float8);
INSERT INTO example_dests VALUES } . join(",\n    ", @rows) . q{;
SELECT count(ratebucket.bucket_configure(url, rate, capacity)) FROM example_dests;

CREATE TABLE example_claims (event_id bigint, attempt int, claimed_at timestamptz);
CREATE FUNCTION example_claimed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- now(): the claim's transaction start, before it took the event's tokens
    INSERT INTO public.example_claims VALUES (NEW.id, NEW.attempts + 1, now());
    RETURN NULL;
END $$;
CREATE TRIGGER example_claimed AFTER UPDATE OF status ON webhook_events
    FOR EACH ROW WHEN (NEW.status = 'sending' AND OLD.status <> 'sending')
    EXECUTE FUNCTION example_claimed();

-- each worker's events once it stopped, and when its events were enqueued
CREATE TABLE example_events AS
    SELECT ''::text AS lang, id, endpoint, status, attempts FROM webhook_events WITH NO DATA;
CREATE TABLE example_runs (lang text, inserted_at timestamptz, others_at timestamptz);
CREATE TABLE sim_run (started timestamptz);
CREATE TABLE sim_requests (t_us bigint, endpoint text, event_id bigint, attempt int, status int);
});

my $sim = IPC::Run::start(
	[ 'demo/simulator', '--port', $sim_port, '--config', "$work/simulator.conf",
	  '--log', "$work/requests.csv", '--ready-file', "$work/simulator.ready" ],
	'<', \undef, '>', "$work/simulator.out", '2>&1');
my $deadline = Time::HiRes::time() + 20;
Time::HiRes::sleep(0.05) until -s "$work/simulator.ready" || Time::HiRes::time() > $deadline;
ok(-s "$work/simulator.ready", "the simulator is listening on 127.0.0.1:$sim_port")
  or BAIL_OUT('the simulator did not start: ' . slurp_file("$work/simulator.out"));
# its start on the wall clock (the second line; the file goes when it exits)
my (undef, $sim_start_us) = split /\n/, slurp_file("$work/simulator.ready");

# Wait until the worker sleeps after an empty claim: its session idle, its
# last statement next_due().
sub wait_until_asleep
{
	my ($seconds) = @_;
	my $until = Time::HiRes::time() + $seconds;
	while (Time::HiRes::time() < $until)
	{
		return 1 if $node->safe_psql('postgres', q{
SELECT count(*) FROM pg_stat_activity
WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()
  AND state = 'idle' AND query LIKE '%next_due%'}) eq '1';
		Time::HiRes::sleep(0.05);
	}
	return 0;
}

# The events of a worker's destinations @dests, then the moment they were
# committed (and NOTIFY sent) in the column $mark of example_runs.
sub enqueue
{
	my ($lang, $mark, @names) = @_;
	my $urls = join(', ', map { "'" . url("$lang-$_") . "'" } @names);
	$node->safe_psql('postgres', qq{
INSERT INTO webhook_events (endpoint, payload)
SELECT d.url, jsonb_build_object('type', 'order.updated', 'seq', g)
FROM example_dests d, generate_series(1, CASE d.dest } . join(' ', map { "WHEN '$_' THEN $DEST{$_}[3]" } @names) . qq{ END) AS g
WHERE d.url IN ($urls);
UPDATE example_runs SET $mark = clock_timestamp() WHERE lang = '$lang';
});
	return;
}

my %ran;
my %worker_cmd = (
	python => [ 'python3', 'examples/python/worker.py' ],
	node   => [ 'node', 'examples/node/worker.js' ],
);
for my $lang (@langs)
{
	if ($missing{$lang})
	{
		if ($required)
		{
			fail("$lang worker: $missing{$lang}, and EXAMPLES_REQUIRED=1");
		}
		else
		{
		  SKIP: { skip("the $lang worker: $missing{$lang}", 1); }
		}
		next;
	}
	my ($out, $err) = ('', '');
	my $worker;
	{
		local %ENV = (%ENV, PGHOST => $node->host, PGPORT => $node->port,
			PGDATABASE => 'postgres', PGUSER => $user);
		delete @ENV{qw(PGOPTIONS PGSERVICE PGSSLMODE)};
		$worker = IPC::Run::start($worker_cmd{$lang}, '<', \undef, '>', \$out, '2>', \$err);
	}
	$node->safe_psql('postgres', "INSERT INTO example_runs (lang) VALUES ('$lang')");
	ok(wait_until_asleep(30), "$lang: the worker started and sleeps on an empty queue")
	  or diag($err);
	Time::HiRes::sleep(0.3);
	enqueue($lang, 'inserted_at', 'paced');
	Time::HiRes::sleep($PACED_SECONDS);
	enqueue($lang, 'others_at', grep { $_ ne 'paced' } @dests);
	Time::HiRes::sleep($RUN_SECONDS);
	$worker->signal('TERM');
	my $exited = eval {
		$worker->finish(IPC::Run::timeout(30));
		1;
	};
	$worker->kill_kill unless $exited;
	my $code = $exited ? $worker->full_result(0) : -1;    # a signal's death is not 0
	note("$lang worker's output:\n$out$err");
	is($code, 0, "$lang: the worker exited 0 after SIGTERM"
		  . ($exited ? " (wait status $code)" : ' (it did not exit within 30 s)'));
	$node->safe_psql('postgres', qq{
INSERT INTO example_events SELECT '$lang', id, endpoint, status, attempts FROM webhook_events;
DELETE FROM webhook_events;
});
	$ran{$lang} = 1;
}

# The simulator's log, on the database's clock: its start (wall clock)
# plus t_us.
$sim->signal('TERM');
$sim->finish(IPC::Run::timeout(30));
$node->safe_psql('postgres', qq{
INSERT INTO sim_run VALUES (timestamptz 'epoch' + $sim_start_us * interval '1 microsecond');
COPY sim_requests FROM '$work/requests.csv' WITH (FORMAT csv);
});

# Every figure of the checks, one row per worker and one per destination.
my %w = map { my @f = split /\|/; ($f[0] => \@f) } split /\n/, $node->safe_psql('postgres', q{
CREATE VIEW arrivals AS
SELECT s.endpoint AS name, s.t_us / 1e6 AS t, s.event_id, s.attempt, s.status,
       r.started + s.t_us * interval '1 microsecond' AS at,
       (SELECT max(c.claimed_at) FROM example_claims c     -- its claim
        WHERE c.event_id = s.event_id AND c.attempt = s.attempt
          AND c.claimed_at <= r.started + s.t_us * interval '1 microsecond') AS claimed_at
FROM sim_requests s, sim_run r;
CREATE TABLE example_arrivals AS
SELECT d.lang, a.* FROM arrivals a JOIN example_dests d USING (name);

SELECT r.lang,
       (SELECT count(*) FROM example_events e WHERE e.lang = r.lang AND e.status = 'sending'),
       (SELECT count(*) FROM example_claims c JOIN example_events e ON e.id = c.event_id
        WHERE e.lang = r.lang),
       (SELECT coalesce(sum(attempts), 0) FROM example_events e WHERE e.lang = r.lang),
       (SELECT count(*) FROM example_arrivals a WHERE a.lang = r.lang),
       (SELECT round(extract(epoch FROM min(a.at) - r.inserted_at)::numeric, 3)
        FROM example_arrivals a WHERE a.lang = r.lang)
FROM example_runs r});

# Per destination, arrivals over any window T (t_i to t_j): j - i + 1 of
# them, at most rate*(T + d) + capacity.
my %d = map { my @f = split /\|/; ($f[0] => \@f) } split /\n/, $node->safe_psql('postgres', q{
WITH n AS (
    SELECT name, t, row_number() OVER (PARTITION BY name ORDER BY t) AS k FROM example_arrivals),
w AS (
    SELECT name, k - d.rate * t AS hi,
           max(d.rate * t - k) OVER (PARTITION BY name ORDER BY t, k
                                     ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS lo
    FROM n JOIN example_dests d USING (name))
SELECT d.name,
       (SELECT count(*) FROM example_events e WHERE e.endpoint = d.url AND e.status = 'delivered'),
       (SELECT count(DISTINCT event_id) FROM example_arrivals a
        WHERE a.name = d.name AND a.status BETWEEN 200 AND 299),
       (SELECT count(*) FROM example_arrivals a WHERE a.name = d.name AND a.status BETWEEN 200 AND 299),
       (SELECT count(*) FROM example_arrivals a WHERE a.name = d.name AND a.status = 429),
       coalesce(b.successes, 0), coalesce(b.throttles, 0),
       (SELECT round((coalesce(max(hi + lo), 0) + 1)::numeric, 2) FROM w WHERE w.name = d.name),
       (SELECT coalesce(round(extract(epoch FROM max(at - claimed_at))::numeric, 3), 0)
        FROM example_arrivals a WHERE a.name = d.name),
       (SELECT count(*) FROM example_arrivals a WHERE a.name = d.name AND claimed_at IS NULL),
       (SELECT count(*) FROM example_arrivals a WHERE a.name = d.name),
       (SELECT count(*) FROM example_arrivals a WHERE a.name = d.name AND a.at < r.others_at),
       round(extract(epoch FROM r.others_at - r.inserted_at)::numeric, 2),
       (SELECT k.limit_factor FROM ratebucket.buckets k WHERE k.endpoint = d.url),
       (SELECT round(extract(epoch FROM max(a.at) - min(a.at) FILTER (WHERE a.status = 429))::numeric, 2)
        FROM example_arrivals a WHERE a.name = d.name)
FROM example_dests d
JOIN example_runs r USING (lang)
LEFT JOIN ratebucket.bucket_status b ON b.endpoint = d.url});

for my $lang (grep { $ran{$_} } @langs)
{
	my (undef, $sending, $claims, $attempts, $requests, $since_insert) = @{ $w{$lang} };
	is($sending, 0, "$lang: no event left 'sending' after the worker stopped");
	ok($claims > 0 && $claims == $attempts && $attempts == $requests,
		"$lang: every claim recorded as an attempt that reached its destination"
		  . " ($claims claims, $attempts attempts recorded, $requests requests received)");
	ok($since_insert ne '' && $since_insert < 2,
		"$lang: the sleeping worker woke on NOTIFY (first request "
		  . ($since_insert eq '' ? 'never' : "$since_insert s after the insert")
		  . '; it sleeps up to 5 s)');

	for my $dest (@dests)
	{
		my ($rate, $capacity) = @{ $DEST{$dest} };
		my $name = "$lang-$dest";
		my (undef, $delivered, $ok_events, $ok, $throttled, $successes, $throttles,
			$excess, $d, $unpaired, $n, $alone, $alone_s, $factor, $after_429) = @{ $d{$name} };
		ok($delivered > 0 && $delivered == $ok_events && $successes == $ok && $throttles == $throttled,
			"$name: $delivered delivered, the events it answered 2xx ($ok_events);"
			  . " ratebucket observed $successes 2xx and $throttles 429s of its $ok and $throttled");

		my $bound = $capacity + $rate * ($d + $CLOCK_SLACK);
		ok($unpaired == 0 && $excess <= $bound + 1e-9,
			"$name: $n arrivals, within rate*(T + d) + capacity over every window"
			  . " (worst $excess of $bound, d $d s + ${CLOCK_SLACK} s"
			  . ($unpaired ? ", $unpaired without a claim" : '') . ')');

		if ($dest eq 'paced')
		{
			ok($alone >= 0.5 * $rate * $alone_s,
				"$name: $alone requests in the $alone_s s it had the queue to itself, at $rate/s"
				  . ' in bursts of 1: the worker slept only as long as next_due() said');
		}
		elsif ($dest eq 'throttled')
		{
			ok($throttled > 0, "$name: the destination answered 429 ($throttled), so their recording was tested");
			ok($after_429 ne '' && $after_429 > 1,
				"$name: its Retry-After (1 s) reached ratebucket: requests went on "
				  . ($after_429 eq '' ? '?' : $after_429) . ' s after its first 429 (20 s without it)');
		}
		elsif ($dest eq 'published')
		{
			ok($factor ne '' && abs($factor - 15 / $rate) < 1e-9,
				"$name: its RateLimit-Policy (15;w=1) reached ratebucket (limit_factor "
				  . ($factor eq '' ? 'NULL' : $factor) . ", 15/$rate)");
		}
	}
}

$node->stop;
done_testing();
