/* gather.h: executing mapped runs against a source file.
 *
 * A gather backend turns the runs of tp_map into bytes. The CPU backend (gather_cpu.c) is the
 * reference and is always present; the CUDA backend is an optional module loaded at run time
 * (gather_cuda.c) and used only where measurements show it wins. Backends share this table of
 * function pointers so callers never test which one they hold.
 */
#ifndef TP_GATHER_H
#define TP_GATHER_H

#include <stddef.h>
#include <stdint.h>

#include "layout.h"
#include "tp_err.h"

/* Copies len bytes out of a source mapping. Returns 0, or -1 when the source could not be read
 * (a SIGBUS caught by the guard, see guard.h): the copy stopped and nothing was left held. */
typedef int (*tp_copy_fn)(void *dst, const void *src, size_t len);

/* An open source file: a descriptor and, when mapped, a read-only mapping of `size` bytes.
 * Gathers take a table of them, indexed by each TP_RUN_SRC run's `src` (a rank file of one
 * source passes a one-entry table: its runs all name source 0). */
typedef struct tp_src {
	int fd;
	const uint8_t *map; /* NULL when not mapped */
	uint64_t size;      /* size the file had when planned */
	tp_copy_fn copy;    /* how backends copy bytes out of map (NULL: memcpy, unguarded). Only
	                     * this copy can fault, so a backend that holds a lock around it releases
	                     * the lock on the way out as on any error. */
} tp_src;

/* Copies src->map[off, off + len) to dst through src->copy. Returns 0 or -1 (see tp_copy_fn). */
static inline int tp_src_copy(const tp_src *src, void *dst, uint64_t off, size_t len)
{
	if (src->copy)
		return src->copy(dst, src->map + off, len);
	__builtin_memcpy(dst, src->map + off, len);
	return 0;
}

typedef struct tp_gather_ops {
	const char *name;
	/* Copies the bytes of runs[0..n) into dst (their total length), reading each TP_RUN_SRC run
	 * from src[run.src] (a table holding every source the runs name) and TP_RUN_HDR and
	 * TP_RUN_CONST runs from hdr (the file's local bytes: its header, then a served file's
	 * constants). Returns 0, or -1 with e set (TP_EIO, TP_ECHANGED when a source is shorter than
	 * planned). */
	int (*gather)(void *self, const tp_run *runs, size_t n, const tp_src *src,
		      const uint8_t *hdr, uint8_t *dst, tp_err *e);
	void (*destroy)(void *self);
} tp_gather_ops;

typedef struct tp_gather {
	const tp_gather_ops *ops;
	void *self;
} tp_gather;

/* The CPU backend. Where a source's map is set it copies from the mapping through its copy (the
 * guard, where the file can shrink or fail); without, it uses pread. Stateless. */
extern const tp_gather_ops tp_gather_cpu_ops;
extern const tp_gather tp_gather_cpu_backend;

/* Convenience: the CPU backend's gather without a backend object (src a table, as above). */
int tp_gather_cpu(const tp_run *runs, size_t n, const tp_src *src, const uint8_t *hdr,
		  uint8_t *dst, tp_err *e);

/* Total bytes the runs produce. */
uint64_t tp_runs_bytes(const tp_run *runs, size_t n);

#endif
