/* sigs.c — the signals a daemon's main() waits for (sigs.h). */
#include "common/sigs.h"

#include <pthread.h>

void sigs_block(sigset_t *set, int also)
{
    sigemptyset(set);
    sigaddset(set, SIGINT);
    sigaddset(set, SIGTERM);
    if (also) sigaddset(set, also);
    pthread_sigmask(SIG_BLOCK, set, NULL);
    signal(SIGPIPE, SIG_IGN);
}
