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
};

typedef struct tp_run {
	uint64_t off;
	uint64_t len;
	uint32_t kind;
	uint32_t src;   /* TP_RUN_SRC: the index of the source read, in the table of sources of the
	                 * file mapped (a tp_layout has one source: always 0); 0 for other kinds */
} tp_run;

#endif
