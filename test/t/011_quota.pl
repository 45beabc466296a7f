# 011_quota.pl — a calendar quota under concurrency, alone and together
# with a rate bucket in bucket_take_all.
#
# An account has a monthly quota of 300 (Asia/Tokyo); one of its endpoints
# has a rate bucket far from empty (1000/s, burst 1000).  8 pgbench clients
# take for 3 s, far more than the quota allows: the endpoint and the quota
# together with bucket_take_all (naming them in both orders; 1 in 7 rolled
# back), the quota alone with bucket_take, and batches with
# bucket_take_upto.  Every grant is recorded in the same transaction as the
# take.  Checked:
#
#   Exact                 the grants recorded sum to exactly the quota, and
#                         the row says so (used 300, remaining 0): never one
#                         more, however many sessions race for the last.
#   All or nothing        the endpoint's bucket granted exactly the
#                         bucket_take_all grants: a take the quota refused
#                         took nothing from the endpoint.
#   Rollback              some takes rolled back; their units came back (they
#                         are not in the count above, and the quota was
#                         still spent to the last unit).
#   No deadlock, no error pgbench reports no failed transaction.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use lib 'test/perl';
use RatebucketTest;

my $node = start_node('quota', conf => "max_connections = 30\n");

$node->safe_psql('postgres', q{
SELECT ratebucket.bucket_configure_quota('acct.monthly', 300, 'month', 'Asia/Tokyo');
SELECT ratebucket.bucket_configure('ep', 1000, 1000);
CREATE TABLE grants (
	how text NOT NULL,
	n int NOT NULL
);
CREATE SEQUENCE rolled_back;
});

my $window = q{SELECT quota_window_start FROM ratebucket.bucket_status WHERE endpoint = 'acct.monthly'};
my $window_before = $node->safe_psql('postgres', $window);

$node->pgbench(
	"-n -M prepared -c 8 -j 2 -T 3",
	0,
	[ qr{number of failed transactions: 0 \(0\.000%\)} ],
	[ qr{^$} ],
	'8 clients race for a quota of 300, with and without a rate bucket: no error, no deadlock',
	{
		'001_all@3' => q{
INSERT INTO grants (how, n)
SELECT 'all', 1 FROM ratebucket.bucket_take_all(ARRAY['ep', 'acct.monthly']) WHERE allowed;
},
		'002_all_reversed@3' => q{
INSERT INTO grants (how, n)
SELECT 'all', 1 FROM ratebucket.bucket_take_all(ARRAY['acct.monthly', 'ep']) WHERE allowed;
},
		'003_all_rollback@1' => q{
BEGIN;
SELECT nextval('rolled_back')
FROM ratebucket.bucket_take_all(ARRAY['ep', 'acct.monthly']) WHERE allowed;
ROLLBACK;
},
		'004_take@2' => q{
INSERT INTO grants (how, n)
SELECT 'take', 1 FROM ratebucket.bucket_take('acct.monthly') WHERE allowed;
},
		'005_upto@2' => q{
INSERT INTO grants (how, n)
SELECT 'upto', granted FROM ratebucket.bucket_take_upto('acct.monthly', 3) WHERE granted > 0;
},
	},
	'postgres');

SKIP:
{
	skip 'the quota\'s month ended during the run', 5
	  if $node->safe_psql('postgres', $window) ne $window_before;

	my ($recorded, $all, $used, $remaining, $ep_granted, $quota_granted) =
	  query_row($node, q{
SELECT (SELECT sum(n) FROM grants),
       (SELECT count(*) FROM grants WHERE how = 'all'),
       q.quota_used, q.quota_remaining, e.tokens_granted, q.tokens_granted
FROM ratebucket.bucket_status q, ratebucket.bucket_status e
WHERE q.endpoint = 'acct.monthly' AND e.endpoint = 'ep'});

	is($recorded, 300, 'the grants recorded sum to exactly the quota (300)');
	is("$used/$remaining", '300/0', 'the quota row: 300 used, 0 remaining');
	is($quota_granted, 300, "the quota's counter: 300 tokens granted");
	is($ep_granted, $all,
		"the endpoint's bucket granted exactly the $all bucket_take_all grants: all or nothing");
	# (is_called: a fresh sequence's last_value is already 1)
	ok($node->safe_psql('postgres', 'SELECT is_called FROM rolled_back') eq 't',
		'some takes rolled back, and their units came back (the count above is still exact)');
	note("bucket_take_all grants $all of 300");
}

$node->stop;
done_testing();
