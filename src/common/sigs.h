/* sigs.h — the signals a daemon's main() waits for. */
#ifndef SHOAL_COMMON_SIGS_H
#define SHOAL_COMMON_SIGS_H

#include <signal.h>

/* Fill *set with SIGINT, SIGTERM and `also` (another signal the daemon handles, e.g. SIGHUP;
 * 0 for none) and block them in the calling thread, before it starts any other: every thread
 * inherits the mask, one that arrives early stays pending, and main() collects them with
 * sigwait(set). SIGPIPE is ignored: a peer gone is an error return from a write, not a kill. */
void sigs_block(sigset_t *set, int also);

#endif
