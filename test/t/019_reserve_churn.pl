# 019_reserve_churn.pl — token reserves under churn: 8 clients take from
# endpoints with reserves (hot, warm and cold ones, a template's follower
# among them) while one client changes them every 150 ms (lower limits, a
# pause and its end, a 429, the reserve taken away and given back, the
# template changed) and another sends invalidations every 200 ms (an ALTER
# TABLE and an ANALYZE of an unrelated table, a VACUUM of the buckets).
# Every grant is recorded in the same transaction as its take, stamped
# before and after it; per endpoint, the grants certainly inside any window
# stay within rate*T + capacity, with the highest limits the endpoint ever
# had (the churn only lowers them).

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run ();

use lib 'test/perl';
use RatebucketTest;

my $seconds = 10;
my $node = start_node('churn',
	conf => "shared_preload_libraries = 'ratebucket'\n"
	  . "max_connections = 30\nsynchronous_commit = off\n");

# endpoint => [rate, capacity, batch]; acct:t follows the template acct:*
my %ep = (
	'hot'    => [ 300, 30, 10 ],
	'warm'   => [ 50,  10, 5 ],
	'cold1'  => [ 2,   5,  2 ],
	'cold2'  => [ 2,   5,  2 ],
	'acct:t' => [ 100, 20, 10 ]);
my @names = sort keys %ep;
my $setup = q{
CREATE TABLE grants (endpoint text NOT NULL, lo timestamptz NOT NULL, hi timestamptz NOT NULL);
CREATE TABLE churn_other (x int) WITH (autovacuum_enabled = false);
INSERT INTO churn_other SELECT generate_series(1, 1000);
SELECT ratebucket.bucket_template('acct:*', 100, 20);
SELECT allowed FROM ratebucket.bucket_take('acct:t');
};
for my $e (@names)
{
	my ($r, $c, $b) = @{ $ep{$e} };
	$setup .= "SELECT ratebucket.bucket_configure('$e', $r, $c);\n" unless $e eq 'acct:t';
	$setup .= "SELECT ratebucket.bucket_reserve('$e', $b);\n";
}
# One change of endpoint number e (1..5, in name order): limits lowered to
# a half or put back, a pause or its end, a 429, the reserve taken away or
# given back, the template changed; never above the limits set up here.
my $arrays = join(', ',
	'ARRAY[' . join(', ', map { "'$_'" } @names) . ']',
	'ARRAY[' . join(', ', map { $ep{$_}[0] } @names) . ']::float8[]',
	'ARRAY[' . join(', ', map { $ep{$_}[1] } @names) . ']::float8[]',
	'ARRAY[' . join(', ', map { $ep{$_}[2] } @names) . ']');
$setup .= qq{
CREATE FUNCTION churn(op int, i int) RETURNS void LANGUAGE plpgsql AS \$\$
DECLARE
	names text[]; rates float8[]; caps float8[]; batches int[];
	e text; f float8 := CASE WHEN random() < 0.5 THEN 0.5 ELSE 1 END;
BEGIN
	SELECT $arrays INTO names, rates, caps, batches;
	e := names[i];
	CASE op
	WHEN 1 THEN
		IF e LIKE 'acct:%' THEN
			PERFORM ratebucket.bucket_template('acct:*', rates[i] * f, caps[i] * f);
		ELSE
			PERFORM ratebucket.bucket_configure(e, rates[i] * f, caps[i] * f);
		END IF;
	WHEN 2 THEN PERFORM ratebucket.bucket_pause(e);
	WHEN 3 THEN PERFORM ratebucket.bucket_resume(e);
	WHEN 4 THEN PERFORM ratebucket.bucket_observe(e, 429);
	WHEN 5 THEN PERFORM ratebucket.bucket_reserve(e, NULL);
	ELSE PERFORM ratebucket.bucket_reserve(e, batches[i]);
	END CASE;
END
\$\$;
};
$node->safe_psql('postgres', $setup);

my $dir = $node->basedir;
my @take_opts;
my %weight = ('hot' => 6, 'warm' => 3, 'cold1' => 1, 'cold2' => 1, 'acct:t' => 3);
for my $i (0 .. $#names)
{
	my $e = $names[$i];
	my $file = "$dir/take_$i.sql";
	append_to_file($file, qq{
INSERT INTO grants SELECT '$e', statement_timestamp(), clock_timestamp()
FROM ratebucket.bucket_take('$e') WHERE allowed;
});
	push @take_opts, '-f', "$file\@$weight{$e}";
}
append_to_file("$dir/rollback.sql", q{
BEGIN;
SELECT allowed FROM ratebucket.bucket_take('hot');
ROLLBACK;
});
push @take_opts, '-f', "$dir/rollback.sql\@1";
append_to_file("$dir/churn.sql", qq{
\\set op random(1, 6)
\\set i random(1, @{[ scalar @names ]})
SELECT churn(:op, :i);
\\sleep 150 ms
});
append_to_file("$dir/ddl.sql", q{
\set ff random(50, 100)
ALTER TABLE churn_other SET (fillfactor = :ff);
ANALYZE churn_other;
\sleep 100 ms
VACUUM ratebucket.buckets;
\sleep 100 ms
});

my @conn = ('-h', $node->host, '-p', $node->port, 'postgres');
my %out;
my @runs = (
	[ takes => [ 'pgbench', '-n', '-c', '8', '-j', '2', '-T', $seconds, @take_opts, @conn ] ],
	[ churn => [ 'pgbench', '-n', '-c', '1', '-T', $seconds, '-f', "$dir/churn.sql", @conn ] ],
	[ ddl   => [ 'pgbench', '-n', '-c', '1', '-T', $seconds, '-f', "$dir/ddl.sql", @conn ] ]);
my @h;
for my $run (@runs)
{
	my ($name, $cmd) = @$run;
	$out{$name} = '';
	push @h, IPC::Run::start($cmd, '>', \$out{$name}, '2>&1');
}
for my $i (0 .. $#h)
{
	my $ok = $h[$i]->finish;
	my $name = $runs[$i][0];
	ok($ok && $out{$name} =~ /number of failed transactions: 0 /,
		"$name: pgbench ran without a failed transaction")
	  or diag($out{$name});
	note("$name: $1 transactions") if $out{$name} =~ /number of transactions actually processed: (\d+)/;
}

for my $e (@names)
{
	my ($r, $c) = @{ $ep{$e} };
	my ($excess, $count) = window_excess_bracketed($node,
		"grants WHERE endpoint = '$e'", $r);
	ok($excess <= $c + 1 + 1e-6,
		sprintf('%s: %d grants, at most %.2f certainly inside a window above %d/s (capacity %d, 1 of slack)',
			$e, $count, $excess, $r, $c));
}
my ($drains) = query_row($node, q{SELECT coalesce(sum(drains), 0) FROM ratebucket.bucket_reserves()});
note("reserves drained by the churn: $drains (of those still listed)");

$node->stop;
done_testing();
