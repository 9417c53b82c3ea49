/* map_emit.h: the inner loop the range mappers share (layout.c's tp_map, served.c's
 * tp_served_map), private to them.
 *
 * A cut (tp_cut: `outer` rows, `stride` source bytes apart, each the same pieces, `rep` bytes a
 * row) of one source tensor is walked from any byte of its local bytes, emitting runs that name
 * the source they read (an index into the caller's table of sources), merged with the previous
 * run when they continue it in the same source. Static inline, so that tp_map's loop compiles
 * as it did before the mapper was shared.
 */
#ifndef TP_MAP_EMIT_H
#define TP_MAP_EMIT_H

#include "run.h"
#include "spec.h"

/* Appends a run, merging with the previous one when it continues it (the same kind and source
 * and contiguous, or both zero fill; a TP_RUN_WIDEN or TP_RUN_TRANSPOSE run never merges: the caller sets its
 * skip and from). Returns 0, or -1 when the output is full and the run could
 * not be merged. */
static inline int tp_emit(tp_run *out, size_t cap, size_t *n, uint32_t kind, uint32_t src, uint64_t off,
			  uint64_t len)
{
	if (*n && kind != TP_RUN_WIDEN && kind != TP_RUN_TRANSPOSE) {
		tp_run *p = &out[*n - 1];
		if (p->kind == kind && (kind == TP_RUN_ZERO || (p->src == src && p->off + p->len == off))) {
			p->len += len;
			return 0;
		}
	}
	if (*n == cap)
		return -1;
	out[*n].kind = (uint16_t)kind;
	out[*n].skip = 0;
	out[*n].from = 0;
	out[*n].src = src;
	out[*n].off = off;
	out[*n].len = len;
	out[*n].pos = out[*n].stride = out[*n].rep = 0;
	out[*n].rows = out[*n].cols = 0;
	(*n)++;
	return 0;
}

/* Emits the runs of local bytes [rel, rel + want) of a cut whose rows start at source offset
 * base + o x stride (file offsets of source `src`), with np pieces pc[] (rep bytes a row; zero
 * pieces have off TP_ZERO). Where pc1 is not NULL the pieces are affine in the rank: piece j lies
 * at pc[j].off + rank x (pc1[j].off - pc[j].off) (tp_layout_from_affine). The caller keeps
 * rel + want within outer x rep. Returns the bytes emitted: less than want when out filled. */
static inline uint64_t tp_emit_cut(tp_run *out, size_t cap, size_t *n, uint32_t src, uint64_t base,
				   const tp_piece *pc, const tp_piece *pc1, uint64_t rank, uint32_t np,
				   uint64_t outer, uint64_t stride, uint64_t rep, uint64_t rel, uint64_t want)
{
	uint64_t o = rel / rep, w = rel % rep, done = 0;
	uint32_t j = 0;
	while (w >= pc[j].len) {
		w -= pc[j].len;
		j++;
	}
	while (done < want && o < outer) {
		uint64_t l = pc[j].len - w;
		if (l > want - done)
			l = want - done;
		int full;
		if (pc[j].off == TP_ZERO)
			full = tp_emit(out, cap, n, TP_RUN_ZERO, 0, 0, l);
		else
			full = tp_emit(out, cap, n, TP_RUN_SRC, src,
				       base + o * stride + w + (pc1 ? pc[j].off + rank * (pc1[j].off - pc[j].off) : pc[j].off),
				       l);
		if (full < 0)
			return done;
		done += l;
		w += l;
		if (w == pc[j].len) {
			w = 0;
			if (++j == np) {
				j = 0;
				o++;
			}
		}
	}
	return done;
}

#endif
