/* sha256.h: SHA-256 (FIPS 180-4), small and dependency-free, for the plan digest a rank file
 * carries in its metadata (tpfs.plan). Not used for anything secret: speed is not a goal.
 */
#ifndef TP_SHA256_H
#define TP_SHA256_H

#include <stddef.h>
#include <stdint.h>

typedef struct tp_sha256 {
	uint32_t h[8];
	uint64_t len;      /* bytes hashed so far */
	uint8_t buf[64];   /* the partial block */
	size_t nbuf;       /* bytes in buf, 0..63 */
} tp_sha256;

void tp_sha256_init(tp_sha256 *s);
void tp_sha256_update(tp_sha256 *s, const void *data, size_t len);
/* Finishes and writes the 32-byte digest; s must be initialized again before reuse. */
void tp_sha256_final(tp_sha256 *s, uint8_t out[32]);
/* The digest of data as 64 lowercase hex digits and a NUL. */
void tp_sha256_hex(const void *data, size_t len, char out[65]);

#endif
