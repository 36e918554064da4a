/* slot.c — CRC16-XMODEM, hash tags and the default slot map (see slot.h).
 *
 * No Debian library ships CRC16-XMODEM under a stable API, so it is computed here with a
 * 256-entry table built once (the table is 512 bytes; the loop is one lookup per byte). */
#include "common/slot.h"

#include <pthread.h>
#include <string.h>

static uint16_t slot_table[256];
static pthread_once_t slot_once = PTHREAD_ONCE_INIT;

static void slot_table_init(void)
{
    for (unsigned i = 0; i < 256; i++) {
        uint16_t c = (uint16_t)(i << 8);
        for (int b = 0; b < 8; b++) c = (uint16_t)((c & 0x8000) ? (c << 1) ^ 0x1021 : c << 1);
        slot_table[i] = c;
    }
}

uint16_t slot_crc16(const void *data, size_t n)
{
    pthread_once(&slot_once, slot_table_init);
    const unsigned char *p = data;
    uint16_t crc = 0;
    for (size_t i = 0; i < n; i++)
        crc = (uint16_t)((crc << 8) ^ slot_table[((crc >> 8) ^ p[i]) & 0xff]);
    return crc;
}

void slot_hash_part(const char *key, size_t nkey, const char **h, size_t *nh)
{
    const char *open = memchr(key, '{', nkey);
    if (open) {
        const char *start = open + 1, *end = key + nkey;
        const char *close = memchr(start, '}', (size_t)(end - start));
        if (close && close > start) {
            *h = start;
            *nh = (size_t)(close - start);
            return;
        }
    }
    *h = key;
    *nh = nkey;
}

uint16_t slot_of_key(const char *key, size_t nkey)
{
    const char *h;
    size_t nh;
    slot_hash_part(key, nkey, &h, &nh);
    return (uint16_t)(slot_crc16(h, nh) % SLOT_COUNT);
}

uint32_t slot_default_owner(uint32_t slot, uint32_t nnodes)
{
    /* the largest i with floor(i*S/N) <= slot is floor(((slot+1)*N - 1) / S) */
    return (uint32_t)((((uint64_t)slot + 1) * nnodes - 1) / SLOT_COUNT);
}
