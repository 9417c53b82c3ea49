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
	TP_RUN_TRANSPOSE, /* len bytes of a transposed cut (a served tensor's last two axes swapped):
	                 * output bytes [pos, pos + len) of matrices [R, C] -> [C, R] of `from`-byte
	                 * elements, whose local row q (C elements, q = m x R + r) lies at source offset
	                 * off + (q x C x from / rep) x stride + q x C x from % rep of source `src`
	                 * (rep a multiple of C x from). Only served files emit it; never merged; only
	                 * the CPU gather executes it. */
};

typedef struct tp_run {
	uint64_t off;
	uint64_t len;
	uint16_t kind;
	uint8_t skip;   /* TP_RUN_WIDEN only: 0 to 3 */
	uint8_t from;   /* TP_RUN_WIDEN only: the source dtype (st_dtype) */
	uint32_t src;   /* TP_RUN_SRC, TP_RUN_WIDEN and TP_RUN_TRANSPOSE: the index of the source read, in
	                 * the table of sources of the file mapped (a tp_layout has one source: always
	                 * 0); 0 for other kinds */
	/* TP_RUN_TRANSPOSE only (0 otherwise): the first output byte within the transposed part, the
	 * source bytes between two rows of the cut, the cut's bytes a row, and the matrices' shape
	 * before the swap (from: the element size) */
	uint64_t pos, stride, rep;
	uint32_t rows, cols;
} tp_run;

/* The run layout a gather module is built for: a module exports it (tp_cuda_abi) and the loader refuses
 * a module of another (gather_module.c), so a stale installed module never misreads runs. Bump the
 * version with any change to tp_run or to the run kinds. */
#define TP_RUN_ABI ((2u << 16) | (unsigned)sizeof(tp_run))

/* Whether run r reads a source (TP_RUN_SRC, TP_RUN_WIDEN or TP_RUN_TRANSPOSE). */
static inline int tp_run_reads(const tp_run *r)
{
	return r->kind == TP_RUN_SRC || r->kind == TP_RUN_WIDEN || r->kind == TP_RUN_TRANSPOSE;
}

/* The source offset of local byte x of a TP_RUN_TRANSPOSE run's cut (x < its rows x rep). */
static inline uint64_t tp_run_t_src(const tp_run *r, uint64_t x)
{
	return r->off + x / r->rep * r->stride + x % r->rep;
}

/* The local bytes [*lo, *hi) of a TP_RUN_TRANSPOSE run's cut that hold every element it reads:
 * from the first output element's matrix row 0 to the last one's last row (whole matrices when
 * the run spans more than one output row). */
static inline void tp_run_t_span(const tp_run *r, uint64_t *lo, uint64_t *hi)
{
	uint64_t es = r->from, mat = (uint64_t)r->rows * r->cols * es;
	uint64_t k0 = r->pos / es, k1 = (r->pos + r->len - 1) / es; /* output elements, inclusive */
	uint64_t m0 = k0 / ((uint64_t)r->rows * r->cols), m1 = k1 / ((uint64_t)r->rows * r->cols);
	*lo = m0 * mat;
	*hi = (m1 + 1) * mat;
}

/* The source bytes run r reads: len for TP_RUN_SRC, the 2-byte values a TP_RUN_WIDEN run widens,
 * len for a TP_RUN_TRANSPOSE run (each output byte is one source byte), 0 for the other kinds. */
static inline uint64_t tp_run_src_bytes(const tp_run *r)
{
	if (r->kind == TP_RUN_SRC || r->kind == TP_RUN_TRANSPOSE)
		return r->len;
	if (r->kind == TP_RUN_WIDEN)
		return (r->skip + r->len + 3) / 4 * 2;
	return 0;
}

/* The source bytes [*a, *b) from the first byte run r reads to one past its last (for a
 * TP_RUN_TRANSPOSE run: the cut rows of tp_run_t_span, other ranks' bytes between them included;
 * tp_io_ranges plans only its rows). Empty (*a == *b) for a run that reads no source. */
static inline void tp_run_src_span(const tp_run *r, uint64_t *a, uint64_t *b)
{
	if (r->kind == TP_RUN_TRANSPOSE) {
		uint64_t lo, hi;
		tp_run_t_span(r, &lo, &hi);
		*a = tp_run_t_src(r, lo);
		*b = tp_run_t_src(r, hi - 1) + 1;
		return;
	}
	*a = r->off;
	*b = r->off + tp_run_src_bytes(r);
}

#endif
