#!/usr/bin/perl
# Perl (Cache::Memcached) scenarios for test_tool_matrix.py.
# Usage: perl matrix.pl HOST:PORT CASE   prints the case's outcome as one JSON document.
use strict;
use warnings;
use Cache::Memcached;
use JSON::PP;

my ($addr, $case) = @ARGV;
my $m = Cache::Memcached->new({servers => [$addr], connect_timeout => 2, select_timeout => 3});
my $json = JSON::PP->new->canonical->allow_nonref;
my %o;

sub b { return $_[0] ? JSON::PP::true : JSON::PP::false }

if ($case eq 'set_get') {
    my $big = 'q' x 300_000;
    $o{set} = [b($m->set('pl_a', 'alpha')), b($m->set('pl_big', $big)),
               b($m->set('pl_ref', {list => [1, 2]}))];
    $o{get} = [$m->get('pl_a'), length($m->get('pl_big') // ''), $m->get('pl_ref'),
               $m->get('pl_absent')];
    $o{add} = [b($m->add('pl_a', 'x')), b($m->replace('pl_absent', 'x')),
               b($m->replace('pl_a', 'beta')), $m->get('pl_a')];
    $o{delete} = [b($m->delete('pl_a')), b($m->delete('pl_a')), $m->get('pl_a')];
} elsif ($case eq 'get_multi') {
    my %want = map { ("pl_k$_" => "v$_" x $_) } 1 .. 200;
    $m->set($_, $want{$_}) for keys %want;
    my $got = $m->get_multi(keys %want, 'pl_absent1', 'pl_absent2');
    $o{count} = scalar(keys %$got);
    $o{same} = b(join(',', map { "$_=$got->{$_}" } sort keys %$got) eq
                 join(',', map { "$_=$want{$_}" } sort keys %want));
} elsif ($case eq 'incr_decr') {
    $m->set('pl_n', 10);
    $o{arith} = [$m->incr('pl_n'), $m->incr('pl_n', 9), $m->decr('pl_n', 100), $m->get('pl_n'),
                 $m->incr('pl_absent')];
} elsif ($case eq 'stats') {
    $m->set('pl_s', 'v');
    $m->get('pl_s');
    my $s = $m->stats(['misc']);
    my $h = $s->{hosts}{$addr}{misc} // {};
    $o{misc} = [map { $h->{$_} } qw(curr_items get_hits cmd_set limit_maxbytes)];
    $o{total} = [map { $s->{total}{$_} } qw(curr_items get_hits)];
} elsif ($case eq 'stats_default') {
    # stats() asks for misc, malloc (which memcached answers with ERROR) and self
    $m->set('pl_s', 'v');
    my $s = $m->stats();
    my $h = $s->{hosts}{$addr} // {};
    $o{types} = [sort keys %$h];
    $o{misc_pid} = b(($h->{misc}{pid} // '') =~ /^\d+$/);
    $o{after} = $m->get('pl_s');
}
print $json->encode(\%o), "\n";
