# 010_inflight.pl — in-flight caps under concurrency, and a dead worker's
# slots coming back when their lease runs out.
#
#   Cap holds     8 pgbench clients for 5 s acquire a slot of a key capped at
#                 3, hold it 5 ms ("the delivery"), release it.  Each client
#                 records when it held its slot: from after the acquire
#                 committed to before the release; those intervals lie within
#                 the real holding periods, so at no instant may more than 3
#                 overlap.  Demand saturates the cap (checked: 3 do overlap),
#                 so the check is not vacuous.
#   No leak       a worker that acquires slots and dies without releasing
#                 them holds them until their lease runs out, and not longer:
#                 the next acquire after the lease gets them.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use lib 'test/perl';
use RatebucketTest;

my $node = start_node('inflight', conf => "max_connections = 30\n");

sub sql { return $node->safe_psql('postgres', $_[0]); }

sql(q{
SELECT ratebucket.inflight_configure('acct', 3, '1 minute');
CREATE TABLE held (slot bigint PRIMARY KEY, acquired timestamptz NOT NULL, released timestamptz);
CREATE SEQUENCE refused;
});

$node->pgbench(
	'-n -c 8 -j 2 -T 5',
	0,
	[ qr{number of failed transactions: 0 \(0\.000%\)} ],
	[ qr{^$} ],
	'8 clients acquire, hold and release slots of a key capped at 3',
	{
		'001_deliver' => q{
SELECT coalesce((ratebucket.inflight_acquire('acct'))[1], 0) AS slot \gset
\if :slot > 0
INSERT INTO held (slot, acquired) VALUES (:slot, clock_timestamp());
\sleep 5 ms
UPDATE held SET released = clock_timestamp() WHERE slot = :slot;
SELECT ratebucket.inflight_release('acct', ARRAY[:slot]::bigint[]);
\else
SELECT nextval('refused');
\endif
},
	},
	'postgres');

my ($deliveries, $max_overlap, $unreleased) = split /\|/, sql(q{
WITH ev AS (
    SELECT acquired AS t, 1 AS d FROM held
    UNION ALL
    SELECT released, -1 FROM held WHERE released IS NOT NULL),
run AS (
    SELECT sum(d) OVER (ORDER BY t, d ROWS UNBOUNDED PRECEDING) AS n FROM ev)
SELECT (SELECT count(*) FROM held), (SELECT max(n) FROM run),
       (SELECT count(*) FROM held WHERE released IS NULL)});
ok($deliveries > 100, "$deliveries deliveries held a slot");
is($unreleased, 0, 'every slot held was released');
ok($max_overlap <= 3, "at most 3 in flight at any instant (measured $max_overlap)");
is($max_overlap, 3, 'and demand reached the cap: the check is not vacuous');
ok(sql(q{SELECT last_value > 0 FROM refused}) eq 't',
	'acquires found the cap full (refused: no slot, no error)');
is(sql(q{SELECT in_flight || ' ' || expired FROM ratebucket.inflight_status WHERE key = 'acct'}),
	'0 0', 'no slot left behind');

# ------------------------------------------------------------ dead worker --

sql(q{SELECT ratebucket.inflight_configure('dead', 2, '2 seconds')});
my $worker = $node->background_psql('postgres');
is($worker->query_safe(q{SELECT cardinality(ratebucket.inflight_acquire('dead', 2))}), '2',
	'a worker acquires both slots');
# It dies without releasing them (its connection ends; the slots were committed).
$worker->quit;
is(sql(q{SELECT cardinality(ratebucket.inflight_acquire('dead', 2))}), '0',
	'while their lease runs, the dead worker still holds the slots');
$node->poll_query_until('postgres',
	q{SELECT expired = 2 FROM ratebucket.inflight_status WHERE key = 'dead'})
  or die 'the leases never ran out';
is(sql(q{SELECT cardinality(ratebucket.inflight_acquire('dead', 2))}), '2',
	'once the lease has run out, the next acquire gets both slots back: none leaked');

$node->stop;
done_testing();
