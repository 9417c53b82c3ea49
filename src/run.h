/* run.h: what a range mapper emits (tp_map, tp_served_map) and a gather backend executes: one
 * run of bytes of a source file, of zero fill, of the local header, or of a constant. Its own
 * header so that the mappers' shared inner loop (map_emit.h) and the layout need not include
 * each other.
 */
#ifndef TP_RUN_H
#define TP_RUN_H

#include <stdint.h>

enum tp_run_kind {
	TP_RUN_SRC = 0, /* bytes [off, off + len) of source file `src` */
	TP_RUN_ZERO,    /* len zero bytes */
	TP_RUN_HDR,     /* bytes [off, off + len) of the local header */
	TP_RUN_CONST,   /* bytes [off, off + len) of the file's local bytes (a served file's header
	                 * then its constants, tp_served_local): a constant tensor's bytes */
	TP_RUN_WIDEN,   /* len bytes of F32 values, each widened exactly from the 2-byte value (`from`:
	                 * ST_BF16 or ST_F16) of source `src`, the first value at source offset off, of
	                 * whose 4 output bytes the first `skip` are not emitted (a read that starts
	                 * inside a value). Only served files (engine views) emit it; never merged. */
};

typedef struct tp_run {
	uint64_t off;
	uint64_t len;
	uint16_t kind;
	uint8_t skip;   /* TP_RUN_WIDEN only: 0 to 3 */
	uint8_t from;   /* TP_RUN_WIDEN only: the source dtype (st_dtype) */
	uint32_t src;   /* TP_RUN_SRC and TP_RUN_WIDEN: the index of the source read, in the table of
	                 * sources of the file mapped (a tp_layout has one source: always 0); 0 for
	                 * other kinds */
} tp_run;

/* Whether run r reads a source (TP_RUN_SRC or TP_RUN_WIDEN). */
static inline int tp_run_reads(const tp_run *r)
{
	return r->kind == TP_RUN_SRC || r->kind == TP_RUN_WIDEN;
}

/* The source bytes run r reads from r->off: len for TP_RUN_SRC, the 2-byte values a TP_RUN_WIDEN
 * run widens, 0 for the other kinds. */
static inline uint64_t tp_run_src_bytes(const tp_run *r)
{
	if (r->kind == TP_RUN_SRC)
		return r->len;
	if (r->kind == TP_RUN_WIDEN)
		return (r->skip + r->len + 3) / 4 * 2;
	return 0;
}

#endif
