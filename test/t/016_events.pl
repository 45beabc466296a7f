# 016_events.pl — the events ratebucket sends, heard by a listening
# connection.
#
# With ratebucket.events on, a psql session LISTENs on ratebucket_events
# while other sessions change buckets: each change (breaker opened, reopened
# and closed; floor reached and left; paused, resumed, and a pause that
# ended; quota spent, reset, and spent again in a new window) comes as
# exactly one notification, with the payload doc/events.md describes and the
# values the bucket holds.  A change that rolls back, or whose savepoint
# does, sends nothing; one in a transaction still open is heard only at its
# commit; nothing is sent for a stripe, or with ratebucket.events off, which
# only a superuser may set.  Then under 8 clients at once: one breaker, one
# event; one quota spent by concurrent takes, one event.

use strict;
use warnings;

use IPC::Run ();
use JSON::PP ();
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes;

use lib 'test/perl';
use RatebucketTest;

my $node = start_node('events', conf => "ratebucket.events = on\n");

# A psql session kept open: run() sends statements and returns what psql
# printed for them, notifications included (psql prints those after each
# statement).
my $mark = 0;

sub session
{
	my %s = (in => '', out => '', err => '');
	$s{h} = IPC::Run::start(
		[ 'psql', '-X', '-q', '-A', '-t', '-v', 'ON_ERROR_STOP=0',
		  '-d', $node->connstr('postgres') ],
		'<', \$s{in}, '>', \$s{out}, '2>', \$s{err},
		IPC::Run::timer($PostgreSQL::Test::Utils::timeout_default));
	return \%s;
}

sub run
{
	my ($s, $sql) = @_;
	$mark++;
	$s->{in} .= "$sql\n\\echo __done_$mark\n";
	$s->{h}->pump until $s->{out} =~ /__done_$mark\n/;
	$s->{out} =~ s/\A(.*?)__done_$mark\n//s;
	return $1;
}

# The events the listener has heard since last asked: their payloads,
# decoded.  Asks twice, 50 ms apart, so that a notification sent by a commit
# just before is in.
my $listener = session();
run($listener, 'LISTEN ratebucket_events;');

sub heard
{
	my @events;
	for (1 .. 2)
	{
		my $out = run($listener, 'SELECT 1;');
		while ($out =~ /^Asynchronous notification "ratebucket_events" with payload "(.*)" received from server process with PID \d+\.$/mg)
		{
			push @events, JSON::PP::decode_json($1);
		}
		Time::HiRes::sleep(0.05);
	}
	return @events;
}

sub sql { return $node->safe_psql('postgres', $_[0]); }

# A time of the payload's form, as an epoch (for comparisons).
sub epoch
{
	my ($t) = @_;
	return undef unless defined $t;
	return sql("SELECT extract(epoch FROM '$t'::timestamptz)");
}

# --------------------------------------------------------------- breaker --

sql(q{SELECT ratebucket.bucket_configure('b', 10, 10, breaker_failures => 2)});
sql(q{SELECT ratebucket.bucket_observe('b', 500)});
is(scalar(heard()), 0, 'one failure of two: no event');

# the second failure, in a transaction left open, then rolled back
my $writer = session();
run($writer, q{BEGIN; SELECT breaker FROM ratebucket.bucket_observe('b', 500);});
is(scalar(heard()), 0, 'the breaker opened in an open transaction: nothing heard yet');
run($writer, 'ROLLBACK;');
is(scalar(heard()), 0, 'rolled back: nothing sent');

# again, committed
my $before = sql('SELECT extract(epoch FROM clock_timestamp())');
run($writer, q{BEGIN; SELECT breaker FROM ratebucket.bucket_observe('b', 500);});
is(scalar(heard()), 0, 'opened, not committed: nothing heard');
run($writer, 'COMMIT;');
my @e = heard();
is(scalar(@e), 1, 'committed: one event');
is($e[0]{event}, 'breaker_opened', 'it says breaker_opened');
is($e[0]{endpoint}, 'b', 'for the endpoint');
is($e[0]{trips}, 1, 'its first trip');
my ($until) = sql(q{SELECT extract(epoch FROM clock_timestamp() + breaker_seconds * interval '1 s')
                    FROM ratebucket.bucket_status WHERE endpoint = 'b'});
ok(abs(epoch($e[0]{until}) - $until) < 0.5, "until is when the breaker's open period ends");
ok(epoch($e[0]{at}) >= $before - 0.001 && epoch($e[0]{at}) <= $until, 'at is when it was written');
like($e[0]{at}, qr/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$/, 'times are ISO 8601, in UTC');

sql(q{SELECT ratebucket.bucket_observe('b', 500)});
is(scalar(heard()), 0, 'a failure while open changes nothing: no event');

# a probe that fails reopens it; one that succeeds closes it
sql(q{SELECT ratebucket.bucket_configure('h', 10, 10, breaker_failures => 1)});
my $probe = q{SET ratebucket.breaker_open = 200;
              SELECT pg_sleep(0.25);
              SELECT allowed FROM ratebucket.bucket_take('h');};
sql(q{SET ratebucket.breaker_open = 200; SELECT ratebucket.bucket_observe('h', 500)});
@e = heard();
is_deeply([ map { "$_->{event} $_->{trips}" } @e ], ['breaker_opened 1'], 'h: opened');
sql($probe . q{SELECT ratebucket.bucket_observe('h', 503)});
@e = heard();
is_deeply([ map { "$_->{event} $_->{trips}" } @e ], ['breaker_opened 2'],
	'the probe failed: opened again, its second trip');
$probe =~ s/0\.25/0.45/;    # open twice as long on the second trip
sql($probe . q{SELECT ratebucket.bucket_observe('h', 200)});
@e = heard();
is_deeply([ map { $_->{event} } @e ], ['breaker_closed'], 'the probe succeeded: closed');
is_deeply([ sort keys %{ $e[0] } ], [qw(at endpoint event)], 'breaker_closed carries event, endpoint, at');

# ----------------------------------------------------------------- floor --

sql(q{SELECT ratebucket.bucket_configure('f', 10, 10, floor_rate => 9)});
sql(q{SELECT ratebucket.bucket_observe('f', 429, '1')});
@e = heard();
is_deeply([ map { $_->{event} } @e ], ['floor_reached'], 'a 429 lowered f to its floor');
is($e[0]{floor_rate}, 9, 'floor_rate is the floor');
my ($since) = sql(q{SELECT extract(epoch FROM at_floor_since) FROM ratebucket.bucket_status WHERE endpoint = 'f'});
ok(abs(epoch($e[0]{since}) - $since) < 0.000002, 'since is bucket_status.at_floor_since');
sql(q{SELECT ratebucket.bucket_observe('f', 429, '1')});
is(scalar(heard()), 0, 'another 429 in its cooldown: no event');
sql(q{SELECT allowed FROM ratebucket.bucket_take('f', 1, 5, 0.5)});
is(scalar(heard()), 0, 'a take with lower limits of its own, at the floor: no event');
is(sql(q{SELECT at_floor_since IS NOT NULL FROM ratebucket.bucket_status WHERE endpoint = 'f'}), 't',
	'and f is still at its floor (the take judged the floor by its own rate)');
# after the 1 s cooldown the rate returns within return_time (the setting
# of the session whose take decides); the next take that writes says so
sql(q{SET ratebucket.return_time = 100; SELECT pg_sleep(1.3);
      SELECT allowed FROM ratebucket.bucket_take('f')});
@e = heard();
is_deeply([ map { $_->{event} } @e ], ['floor_left'], 'the rate climbed off its floor: floor_left, at the next take');
is(sql(q{SELECT at_floor_since IS NULL FROM ratebucket.bucket_status WHERE endpoint = 'f'}), 't',
	'and bucket_status no longer says at_floor_since');
# a rate that climbed off its floor with no write to say so, lowered to it
# again: both said, in order
sql(q{SET ratebucket.min_cooldown = 0; SELECT ratebucket.bucket_observe('f', 429, '0')});
is_deeply([ map { $_->{event} } heard() ], ['floor_reached'], 'f at its floor again (no cooldown)');
sql(q{SET ratebucket.min_cooldown = 0; SET ratebucket.return_time = 100; SELECT pg_sleep(0.2);
      SELECT ratebucket.bucket_observe('f', 429, '0')});
is_deeply([ map { $_->{event} } heard() ], [ 'floor_left', 'floor_reached' ],
	'left with no take in between, lowered again: floor_left, then floor_reached');

# ----------------------------------------------------------------- pause --

sql(q{SELECT ratebucket.bucket_configure('p', 10, 10)});
sql(q{BEGIN; SELECT ratebucket.bucket_pause('p'); ROLLBACK;});
sql(q{BEGIN; SAVEPOINT s; SELECT ratebucket.bucket_pause('p'); ROLLBACK TO s; COMMIT;});
is(scalar(heard()), 0, 'a pause rolled back, and one rolled back to its savepoint: nothing');
sql(q{SELECT ratebucket.bucket_pause('p')});
@e = heard();
is_deeply([ map { $_->{event} } @e ], ['paused'], 'paused');
ok(exists $e[0]{until} && !defined $e[0]{until}, 'until resumed: until is null');
sql(q{SELECT ratebucket.bucket_resume('p')});
@e = heard();
is_deeply([ map { $_->{event} } @e ], ['resumed'], 'resumed');
sql(q{SELECT ratebucket.bucket_pause('p', '300 ms')});
@e = heard();
my ($pu) = sql(q{SELECT extract(epoch FROM paused_until) FROM ratebucket.bucket_status WHERE endpoint = 'p'});
ok(@e == 1 && abs(epoch($e[0]{until}) - $pu) < 0.000002, 'paused for 300 ms: until is bucket_status.paused_until');
sql(q{SELECT pg_sleep(0.35); SELECT allowed FROM ratebucket.bucket_take('p')});
@e = heard();
is_deeply([ map { $_->{event} } @e ], ['resumed'], 'the pause ended: resumed, at the next take');
sql(q{SELECT allowed FROM ratebucket.bucket_take('p')});
is(scalar(heard()), 0, 'takes after that: no event');

# ----------------------------------------------------------------- quota --

sql(q{SELECT ratebucket.bucket_configure_quota('q', 3, 'day', 'UTC')});
sql(q{SELECT allowed FROM ratebucket.bucket_take('q', 2)});
is(scalar(heard()), 0, 'two of three: no event');
sql(q{SELECT allowed FROM ratebucket.bucket_take('q')});
@e = heard();
is_deeply([ map { $_->{event} } @e ], ['quota_spent'], 'the last one: quota_spent');
is_deeply([ @{ $e[0] }{qw(period quota left)} ], [ 'day', 3, 0 ], 'period, quota, left');
my ($resets) = sql(q{SELECT extract(epoch FROM date_trunc('day', now() AT TIME ZONE 'UTC') + interval '1 day')});
is(epoch($e[0]{resets_at}), $resets, 'resets_at is the next UTC midnight');
sql(q{SELECT allowed FROM ratebucket.bucket_take('q')});
is(scalar(heard()), 0, 'a take refused for want of quota: no event');
sql(q{SELECT ratebucket.bucket_reset('q')});
@e = heard();
is_deeply([ map { "$_->{event} $_->{left}" } @e ], ['quota_reset 3'], 'reset: quota_reset, all of it left');

# a new window: its first take gives the quota back and, taking it all,
# spends it again (the row's window moved back two hours stands for the
# boundary)
sql(q{SELECT ratebucket.bucket_configure_quota('q1', 1, 'hour', 'UTC');
      SELECT allowed FROM ratebucket.bucket_take('q1')});
is_deeply([ map { $_->{event} } heard() ], ['quota_spent'], 'q1, one an hour: spent');
sql(q{UPDATE ratebucket.buckets SET refilled_at = refilled_at - interval '2 hours' WHERE endpoint = 'q1'});
is(sql(q{SELECT allowed FROM ratebucket.bucket_take('q1')}), 't', 'the next window grants it again');
@e = heard();
is_deeply([ map { "$_->{event} $_->{left}" } @e ], [ 'quota_reset 1', 'quota_spent 0' ],
	'quota_reset (all of it left), then quota_spent');
sql(q{SELECT ratebucket.bucket_configure('q1', 10, 10)});
@e = heard();
is_deeply([ map { $_->{event} } @e ], ['quota_reset'], 'q1 made a rate bucket: quota_reset');
ok(exists $e[0]{quota} && !defined $e[0]{quota} && !defined $e[0]{period} && !defined $e[0]{left},
	'with period, quota and left null');

# a claim's batch spends a quota as a take does
sql(q{SELECT ratebucket.bucket_configure_quota('qb', 5, 'hour', 'UTC');
      SELECT ratebucket.bucket_configure('qb:rate', 100, 100)});
is(sql(q{SELECT granted FROM ratebucket.bucket_take_batch(
           ARRAY[ROW(ARRAY['qb', 'qb:rate'], 8, NULL)::ratebucket.batch_request])}), 5,
	'a batch of 8 over qb (5 an hour) and a rate bucket: 5 granted');
@e = heard();
is_deeply([ map { "$_->{event} $_->{endpoint} $_->{period}" } @e ], ['quota_spent qb hour'],
	'quota_spent for qb, from the batch; nothing for the rate bucket');

# ------------------------------------------------------ what sends nothing --

sql(q{SELECT ratebucket.bucket_configure('s', 100, 100); SELECT ratebucket.bucket_stripe('s', 4)});
sql(q{SELECT ratebucket.bucket_pause('s')});
@e = heard();
is_deeply([ map { "$_->{event} $_->{endpoint}" } @e ], ['paused s'],
	'a striped endpoint paused: one event, for the endpoint (none for its 4 stripes)');

sql(q{SET ratebucket.events = off; SELECT ratebucket.bucket_resume('s')});
is(scalar(heard()), 0, 'ratebucket.events off: nothing');
is(sql(q{SELECT paused FROM ratebucket.bucket_status WHERE endpoint = 's'}), 'f', 'though s was resumed');

# bucket_reset: everything it forgets
sql(q{SELECT ratebucket.bucket_configure('r', 10, 10, floor_rate => 9, breaker_failures => 1);
      SELECT ratebucket.bucket_pause('r');
      SELECT ratebucket.bucket_observe('r', 429, '60');
      SELECT ratebucket.bucket_observe('r', 500)});
is_deeply([ sort map { $_->{event} } heard() ], [qw(breaker_opened floor_reached paused)],
	'r paused, at its floor, its breaker open');
sql(q{SELECT ratebucket.bucket_reset('r')});
is_deeply([ map { $_->{event} } heard() ], [qw(breaker_closed floor_left resumed)],
	'bucket_reset: breaker_closed, floor_left, resumed');
sql(q{CREATE ROLE worker LOGIN; GRANT USAGE ON SCHEMA ratebucket TO worker});
# (the library loaded first: a placeholder set before it is dropped at load)
my ($rc, $out, $err) = $node->psql('postgres',
	q{SELECT ratebucket.parse_retry_after('1'); SET ratebucket.events = off},
	extra_params => [ '-U', 'worker' ]);
like($err, qr/permission denied to set parameter "ratebucket.events"/, 'only a superuser may turn events off');

# an endpoint that needs escaping, and the longest one
my $odd = "a\"b\\c\nd\x{e9}";
sql(q{SELECT ratebucket.bucket_take(E'a"b\\\\c\nd' || chr(233), 1, 1);
      SELECT ratebucket.bucket_pause(E'a"b\\\\c\nd' || chr(233))});
@e = heard();
is(scalar(@e), 1, 'an endpoint with quotes, a backslash, a newline and a non-ASCII letter');
is($e[0]{endpoint}, $odd, 'comes back as it was');
sql(q{SELECT ratebucket.bucket_take(repeat(chr(1), 1024), 1, 1);
      SELECT ratebucket.bucket_pause(repeat(chr(1), 1024))});
@e = heard();
is(scalar(@e), 1, 'the longest endpoint, of control characters (6 bytes each in JSON)');
is($e[0]{endpoint}, "\x01" x 1024, 'comes back whole');

# commit order
my $w2 = session();
sql(q{SELECT ratebucket.bucket_configure('o1', 1, 1); SELECT ratebucket.bucket_configure('o2', 1, 1)});
run($writer, q{BEGIN; SELECT ratebucket.bucket_pause('o1');});
run($w2, q{BEGIN; SELECT ratebucket.bucket_pause('o2');});
run($w2, 'COMMIT;');
run($writer, 'COMMIT;');
@e = heard();
is_deeply([ map { $_->{endpoint} } @e ], [qw(o2 o1)], 'events come in commit order');

# ------------------------------------------------------- under 8 clients --

sql(q{SELECT ratebucket.bucket_configure('hot', 1000, 1000, breaker_failures => 5);
      SELECT ratebucket.bucket_configure_quota('hotq', 200, 'day', 'UTC')});
my $dir = PostgreSQL::Test::Utils::tempdir();
append_to_file("$dir/fail.sql", q{SELECT ratebucket.bucket_observe('hot', 500);});
append_to_file("$dir/take.sql", q{SELECT allowed FROM ratebucket.bucket_take('hotq');});
$node->command_ok(
	[ 'pgbench', '-n', '-c', '8', '-j', '2', '-T', '2', '-f', "$dir/fail.sql", '-f', "$dir/take.sql", 'postgres' ],
	'8 clients fail hot and take from hotq for 2 s');
my ($trips, $used) = query_row($node, q{
	SELECT (SELECT breaker_trips FROM ratebucket.buckets WHERE endpoint = 'hot'),
	       (SELECT quota_used FROM ratebucket.bucket_status WHERE endpoint = 'hotq')});
@e = heard();
my %n;
$n{"$_->{event} $_->{endpoint}"}++ for @e;
is($trips, 1, 'hot tripped once (it stays open 30 s)');
is($n{'breaker_opened hot'}, 1, 'one breaker_opened for it, from many concurrent failures');
is($used, 200, 'hotq: all 200 spent');
is($n{'quota_spent hotq'}, 1, 'one quota_spent for it, from many concurrent takes');
is(scalar(@e), 2, 'and nothing else');

$listener->{in} .= "\\q\n";
$listener->{h}->finish;
done_testing();
