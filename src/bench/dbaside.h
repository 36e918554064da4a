/* dbaside.h — `shoal-bench aside-db`: a cache-aside load against a counting stand-in for the
 * database, for the failover scenario (issue 15, scripts/bench-failover.sh).
 *
 * The stand-in lives in the bench process (an array of per-key versions): a "database read" is
 * an atomic load and a counter, so it can never be the bottleneck, and the checks below need
 * the exact moment a version changed. Readers get keys through the cache (a router), count hits
 * and misses, load a miss from the stand-in and set it; a writer bumps keys' versions and then
 * deletes them in the cache (cache-aside). Every value carries its version, so a hit whose
 * version is older than one whose delete was acknowledged before the get was sent is a stale
 * value served. One JSON line per report interval on stdout. */
#ifndef SHOAL_BENCH_DBASIDE_H
#define SHOAL_BENCH_DBASIDE_H

/* Run the subcommand; argv[0] is "aside-db". Returns the process exit status. */
int bench_dbaside_main(int argc, char **argv);

#endif
