# 009_lanes.pl — several limits at once, under concurrency: an account
# ceiling shared by two lanes, taken with bucket_take_all.
#
# The account allows 100/s (burst 100); bulk traffic has a lane of 70/s
# (burst 70) below it and takes from both at once; interactive traffic takes
# from the account alone.  8 pgbench clients saturate both lanes for 5 s,
# bulk naming the buckets in both orders, and 1 bulk take in 7 rolls back.
# Every grant is recorded in the same transaction as the take.  Checked:
#
#   Bound, for every bucket at once   account grants (both lanes) within
#                                     100*T + 100, over the whole run and
#                                     over every window between two grants;
#                                     bulk lane grants within 70*T + 70.
#   All or nothing                    every bulk grant took from both: the
#                                     lane's counters equal the bulk grants,
#                                     the account's equal all grants.
#   Interactive keeps its share       at least 90% of the 30/s bulk can
#                                     never take, while bulk saturates.
#   Efficiency                        the account hands out at least 95% of
#                                     its bound: no token is lost to a take
#                                     another bucket refused.
#   No deadlock, no error             pgbench reports no failed transaction.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use lib 'test/perl';
use RatebucketTest;

my $node = start_node('lanes', conf => "max_connections = 30\n");

$node->safe_psql('postgres', q{
SELECT ratebucket.bucket_configure('acct', 100, 100);
SELECT ratebucket.bucket_configure('acct.bulk', 70, 70);
CREATE TABLE grants (
	lane text NOT NULL,
	at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE SEQUENCE rolled_back;
});

my $seconds = 5;
$node->pgbench(
	"-n -M prepared -c 8 -j 2 -T $seconds",
	0,
	[ qr{number of failed transactions: 0 \(0\.000%\)} ],
	[ qr{^$} ],
	'8 clients saturate both lanes, bulk naming its buckets in both orders: no error, no deadlock',
	{
		'001_bulk@3' => q{
INSERT INTO grants (lane)
SELECT 'bulk' FROM ratebucket.bucket_take_all(ARRAY['acct', 'acct.bulk']) WHERE allowed;
},
		'002_bulk_reversed@3' => q{
INSERT INTO grants (lane)
SELECT 'bulk' FROM ratebucket.bucket_take_all(ARRAY['acct.bulk', 'acct']) WHERE allowed;
},
		'003_bulk_rollback@1' => q{
BEGIN;
SELECT nextval('rolled_back')
FROM ratebucket.bucket_take_all(ARRAY['acct', 'acct.bulk']) WHERE allowed;
ROLLBACK;
},
		'004_interactive@3' => q{
INSERT INTO grants (lane)
SELECT 'interactive' FROM ratebucket.bucket_take('acct') WHERE allowed;
},
	},
	'postgres');

my ($bulk, $interactive, $acct_granted, $lane_granted, $t_acct, $t_lane) =
  query_row($node, q{
SELECT (SELECT count(*) FROM grants WHERE lane = 'bulk'),
       (SELECT count(*) FROM grants WHERE lane = 'interactive'),
       a.tokens_granted, l.tokens_granted,
       extract(epoch FROM a.last_used - a.created_at),
       extract(epoch FROM l.last_used - l.created_at)
FROM ratebucket.bucket_status a, ratebucket.bucket_status l
WHERE a.endpoint = 'acct' AND l.endpoint = 'acct.bulk'});
my $total = $bulk + $interactive;
my $acct_bound = 100 * $t_acct + 100;
my $lane_bound = 70 * $t_lane + 70;

is($acct_granted, $total, "the account's tokens = every grant of both lanes ($total)");
is($lane_granted, $bulk, "the bulk lane's tokens = the bulk grants ($bulk): all or nothing");
ok($total <= $acct_bound + 1e-6,
	sprintf('account: %d grants within 100*T + 100 = %.1f', $total, $acct_bound));
ok($bulk <= $lane_bound + 1e-6,
	sprintf('bulk lane: %d grants within 70*T + 70 = %.1f', $bulk, $lane_bound));
ok($total >= 0.95 * $acct_bound,
	sprintf('account efficiency %.1f%% >= 95%%', 100 * $total / $acct_bound));
my $share = 30 * $t_acct;
ok($interactive >= 0.9 * $share,
	sprintf('interactive: %d grants, at least 90%% of the 30/s bulk cannot take (%.0f)',
		$interactive, $share));
ok($node->safe_psql('postgres', 'SELECT is_called FROM rolled_back') eq 't',
	'some bulk takes rolled back, and their tokens came back (counted above)');

# Over every window between two grants of either lane: at most the account's
# capacity above 100/s (see 001_load.pl for why the half-open window).
my ($excess) = window_excess($node, 'grants', 100);
ok($excess <= 100 + 1e-6,
	sprintf('account, every window: at most %.2f grants above 100/s (capacity 100)', $excess));
my ($bulk_excess) = window_excess($node, q{(SELECT at FROM grants WHERE lane = 'bulk') b}, 70);
ok($bulk_excess <= 70 + 1e-6,
	sprintf('bulk lane, every window: at most %.2f grants above 70/s (capacity 70)', $bulk_excess));

note(sprintf('bulk %d, interactive %d over %.2f s; account bound %.1f, lane bound %.1f',
	$bulk, $interactive, $t_acct, $acct_bound, $lane_bound));

$node->stop;
done_testing();
