# 015_metrics.pl — ratebucket's metrics, scraped from a real exporter.
#
# Debian's prometheus-postgres-exporter runs here against a server of this
# test's own, with the custom queries of metrics/postgres_exporter.yaml, on
# a port of loopback.  Buckets are set in known states (taken from, in a
# cooldown, breaker open, paused, quota spent, at the floor), an in-flight
# cap holds slots, and /metrics is fetched over HTTP: every series the
# queries define is there, with the values the buckets hold; the state
# counts add up to the buckets; and a second scrape after more takes and a
# 429 shows the counters moved by exactly those.
#
# Skipped, saying so, without prometheus-postgres-exporter (./test/run
# installs it).

use strict;
use warnings;

use HTTP::Tiny;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes;

use lib 'test/perl';
use RatebucketTest;

my $exporter = '/usr/bin/prometheus-postgres-exporter';
plan skip_all => "prometheus-postgres-exporter is not installed ($exporter): "
  . 'apt-get install prometheus-postgres-exporter'
  unless -x $exporter;

my $node = start_node('metrics');
$node->safe_psql('postgres', q{
-- rates so low that nothing refills while the test runs
SELECT ratebucket.bucket_configure('m:taken', 0.000001, 10);
SELECT ratebucket.bucket_take('m:taken', 3);
SELECT ratebucket.bucket_configure('m:cool', 1, 10, throttle_factor => 0.5);
SELECT ratebucket.bucket_observe('m:cool', 429, '600');
SELECT ratebucket.bucket_configure('m:open', 1, 10, breaker_failures => 1);
SELECT ratebucket.bucket_observe('m:open', 500);
SELECT ratebucket.bucket_configure('m:paused', 1, 10);
SELECT ratebucket.bucket_pause('m:paused');
SELECT ratebucket.bucket_configure_quota('m:quota', 2, 'day');
SELECT ratebucket.bucket_take('m:quota', 2);
-- its floor reached: a 429 lowers 1/s by 0.25, but not below the floor
SELECT ratebucket.bucket_configure('m:floor', 1, 10, floor_rate => 0.5, throttle_factor => 0.25);
SELECT ratebucket.bucket_observe('m:floor', 429, '600');
SELECT ratebucket.inflight_configure('cap:m', 3);
SELECT ratebucket.inflight_acquire('cap:m', 2);
CREATE ROLE metrics LOGIN;
GRANT USAGE ON SCHEMA ratebucket TO metrics;
GRANT SELECT ON ratebucket.bucket_status, ratebucket.inflight_status TO metrics;
});
my $floor = $node->safe_psql('postgres',
	q{SELECT at_floor_since IS NOT NULL FROM ratebucket.bucket_status WHERE endpoint = 'm:floor'});
is($floor, 't', 'm:floor sits at its floor');

# The exporter, as the unprivileged role, on a free loopback port.
my $port = PostgreSQL::Test::Cluster::get_free_port();
my $dsn = sprintf('host=%s port=%d user=metrics dbname=postgres sslmode=disable',
	$node->host, $node->port);
my ($exp_out, $exp_err) = ('', '');
my $exp;
{
	local $ENV{DATA_SOURCE_NAME} = $dsn;
	$exp = IPC::Run::start(
		[ $exporter, "--web.listen-address=127.0.0.1:$port",
		  '--extend.query-path=metrics/postgres_exporter.yaml',
		  '--disable-default-metrics', '--disable-settings-metrics' ],
		'>', \$exp_out, '2>', \$exp_err);
}
my $http = HTTP::Tiny->new(timeout => 10);

# /metrics as { "name{labels}" => value }, once the exporter answers with
# ratebucket's series.
sub scrape
{
	my $deadline = Time::HiRes::time() + 30;
	while (1)
	{
		my $res = $http->get("http://127.0.0.1:$port/metrics");
		if ($res->{success} && $res->{content} =~ /^ratebucket_totals_endpoints/m)
		{
			my %m;
			for my $line (split /\n/, $res->{content})
			{
				next if $line =~ /^#/ || $line !~ /^ratebucket_/;
				my ($name, $labels, $value) = $line =~ /^(\w+)(?:\{(.*)\})?\s+(\S+)$/ or next;
				# the labels but the exporter's own "server", as name{a="x",b="y"}
				my @l = sort grep { !/^server=/ } split /,(?=\w+=")/, $labels // '';
				$name .= '{' . join(',', @l) . '}' if @l;
				$m{$name} = $value;
			}
			return \%m;
		}
		die "the exporter gave no ratebucket series in 30 s: $exp_err"
		  if Time::HiRes::time() > $deadline;
		Time::HiRes::sleep(0.2);
	}
}

my $m = scrape();
note(join("\n", map { "$_ $m->{$_}" } sort keys %$m));

# Every series the queries file defines is there.
open(my $fh, '<', 'metrics/postgres_exporter.yaml') or die $!;
my ($prefix, @series);
while (my $line = <$fh>)
{
	$prefix = $1 if $line =~ /^(ratebucket_\w+):/;
	push @series, "${prefix}_$1" if $line =~ /^    - (\w+):/;
}
close $fh;
my %labels = map { $_ => 1 } qw(ratebucket_state_state ratebucket_endpoint_endpoint
  ratebucket_quota_endpoint ratebucket_inflight_key);
my @missing = grep { my $s = $_; !$labels{$s} && !grep { /^\Q$s\E(\{|$)/ } keys %$m } @series;
is("@missing", '', 'every series of the queries file is exported (' . scalar(@series) . ' columns)');

# The states, each counted, adding up to the buckets.
my %state = (paused => 1, breaker_open => 1, breaker_half_open => 0, cooldown => 1,
	quota_spent => 1, at_floor => 1, ok => 1);
for my $s (sort keys %state)
{
	is($m->{qq{ratebucket_state_endpoints{state="$s"}}}, $state{$s}, "state $s: $state{$s} endpoint(s)");
}
is($m->{ratebucket_totals_endpoints}, 6, '6 buckets');
is($m->{ratebucket_totals_configured}, 6, 'all configured');

# Per endpoint, what the buckets hold.
is(sprintf('%.3f', $m->{q{ratebucket_endpoint_tokens{endpoint="m:taken"}}}), '7.000', 'm:taken holds 10 - 3 tokens');
is($m->{q{ratebucket_endpoint_takes_granted{endpoint="m:taken"}}}, 1, 'm:taken: one granted take');
cmp_ok($m->{q{ratebucket_endpoint_cooldown_seconds{endpoint="m:cool"}}}, '>', 590,
	'm:cool: its 600 s cooldown, running');
is($m->{q{ratebucket_endpoint_effective_rate{endpoint="m:cool"}}}, 0.5, 'm:cool: its rate halved by the 429');
is($m->{q{ratebucket_endpoint_rate_ratio{endpoint="m:cool"}}}, 0.5, 'm:cool: at 0.5 of its configured rate');
is($m->{q{ratebucket_endpoint_throttles{endpoint="m:cool"}}}, 1, 'm:cool: one throttle');
is($m->{q{ratebucket_endpoint_breaker{endpoint="m:open"}}}, 2, 'm:open: breaker open (2)');
is($m->{q{ratebucket_endpoint_breaker_opens{endpoint="m:open"}}}, 1, 'm:open: one trip');
is($m->{q{ratebucket_endpoint_paused{endpoint="m:paused"}}}, 1, 'm:paused: paused');
is($m->{q{ratebucket_endpoint_at_floor{endpoint="m:floor"}}}, 1, 'm:floor: at its floor');
is($m->{q{ratebucket_endpoint_effective_rate{endpoint="m:floor"}}}, 0.5, 'm:floor: at 0.5/s');
cmp_ok($m->{q{ratebucket_endpoint_at_floor_seconds{endpoint="m:floor"}}}, '>=', 0, 'm:floor: since when');
is($m->{q{ratebucket_quota_used{endpoint="m:quota"}}} . ' ' . $m->{q{ratebucket_quota_remaining{endpoint="m:quota"}}},
	'2 0', 'm:quota: 2 used, 0 left');
cmp_ok($m->{q{ratebucket_quota_resets_in_seconds{endpoint="m:quota"}}}, '<=', 86400, 'm:quota: resets within a day');
is($m->{q{ratebucket_inflight_in_flight{key="cap:m"}}} . ' of ' . $m->{q{ratebucket_inflight_cap{key="cap:m"}}},
	'2 of 3', 'cap:m: 2 slots of 3 held');

# More takes and a 429: the counters move by exactly those.
my $takes_before = $m->{ratebucket_totals_takes_granted};
my $throttles_before = $m->{ratebucket_totals_throttles};
$node->safe_psql('postgres', q{
SELECT ratebucket.bucket_take('m:taken') FROM generate_series(1, 4);
SELECT ratebucket.bucket_observe('m:paused', 429);});
my $m2 = scrape();
is($m2->{ratebucket_totals_takes_granted} - $takes_before, 4, 'totals: 4 more granted takes');
is($m2->{ratebucket_totals_throttles} - $throttles_before, 1, 'totals: 1 more throttle');
is(sprintf('%.3f', $m2->{q{ratebucket_endpoint_tokens{endpoint="m:taken"}}}), '3.000', 'm:taken: 4 more tokens gone');
is($m2->{q{ratebucket_endpoint_throttles{endpoint="m:paused"}}}, 1, 'm:paused: its 429 counted');

$exp->signal('TERM');
$exp->finish;
$node->stop;
done_testing();
