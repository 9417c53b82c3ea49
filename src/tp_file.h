/* tp_file.h: one interface over every served tensor file, whatever made it.
 *
 * Two producers make the tensor files a mount serves: a layout (layout.h: a rank folder's file,
 * one source file cut for one rank) and a served file (served.h: a view's part file, pieces of
 * several source files fused, stacked, widened or constant). The read path (fs_read.c) and the
 * I/O report (tpfs plan --io) see both through this interface alone: the file's size, its local
 * bytes (the header, then a served file's constants), map(offset, length) -> runs over a table
 * of sources, and the page ranges a read of a span must fetch. A layout's table holds one source
 * (its runs all name source 0). A value type: two pointers, one of them set. Pure: no I/O.
 */
#ifndef TP_FILE_H
#define TP_FILE_H

#include <stddef.h>
#include <stdint.h>

#include "io_plan.h"
#include "layout.h"
#include "run.h"
#include "served.h"

typedef struct tp_file {
	const tp_layout *L; /* a rank folder's tensor file, or NULL */
	const tp_served *S; /* a view's part file, or NULL (exactly one of the two is set) */
} tp_file;

static inline tp_file tp_file_of_layout(const tp_layout *L)
{
	return (tp_file){L, NULL};
}

static inline tp_file tp_file_of_served(const tp_served *S)
{
	return (tp_file){NULL, S};
}

/* The file's size in bytes. */
uint64_t tp_file_size(tp_file f);

/* The bytes of its local header (a multiple of 8; no source is read below it). */
uint64_t tp_file_hdr_size(tp_file f);

/* The bytes tp_file_local writes: the header, then a served file's constants. A read whose runs
 * may name local bytes (TP_RUN_HDR, TP_RUN_CONST) needs them: one that starts in the header, and
 * any read of a file with constants (tp_file_local_size > tp_file_hdr_size). */
uint64_t tp_file_local_size(tp_file f);

/* Writes the local bytes (tp_file_local_size) into buf. Deterministic. */
void tp_file_local(tp_file f, uint8_t *buf);

/* The entries of its table of sources (a layout: 1). */
uint32_t tp_file_nsrc(tp_file f);

/* tp_map or tp_served_map: bytes [off, off + len) as at most cap runs; *covered the bytes they
 * produce (call again from off + *covered when less than asked). */
size_t tp_file_map(tp_file f, uint64_t off, uint64_t len, tp_run *out, size_t cap, uint64_t *covered);

/* tp_io_plan or tp_served_io_plan: the page ranges (each naming its source) that bytes [a, b)
 * read. cap >= TP_MAX_PIECES. *covered: the file bytes done; *cut: tp_served_io_plan's cursor in a
 * transposed matrix (a layout's is always 0). Done when a + *covered == b and *cut is 0. */
size_t tp_file_io_plan(tp_file f, uint64_t a, uint64_t b, uint64_t page, tp_io_range *out, size_t cap,
		       uint64_t *covered, uint64_t *cut);

#endif
