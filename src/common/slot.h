/* slot.h — which of the 16,384 slots a key belongs to (design.md "Slots"); shared by the router
 * (routing) and the node (the slots it owns, see node/slots.h).
 *
 * slot = CRC16-XMODEM(h) mod 16384, where h is the text inside the key's first {...} when that
 * is non-empty, else the whole key: the Redis Cluster rule, so `{u:42}:cart` and
 * `{u:42}:profile` share a slot and therefore a node. Anyone can compute a key's slot. */
#ifndef SHOAL_COMMON_SLOT_H
#define SHOAL_COMMON_SLOT_H

#include <stddef.h>
#include <stdint.h>

#define SLOT_COUNT 16384

/* CRC16-XMODEM (polynomial 0x1021, initial value 0, no reflection, no final xor). Its check
 * value for "123456789" is 0x31C3. */
uint16_t slot_crc16(const void *data, size_t n);
/* The bytes that are hashed: the first non-empty {hash tag}, else the whole key. */
void slot_hash_part(const char *key, size_t nkey, const char **h, size_t *nh);
/* The key's slot, 0 .. SLOT_COUNT-1. */
uint16_t slot_of_key(const char *key, size_t nkey);
/* Default map: the index of the node, of `nnodes` listed in order, that owns `slot`
 * (node i owns floor(i*16384/N) .. floor((i+1)*16384/N)-1). nnodes must be >= 1. */
uint32_t slot_default_owner(uint32_t slot, uint32_t nnodes);

#endif
