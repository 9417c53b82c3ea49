/* spec.h: shard specs, the unit of meaning between plans and layouts.
 *
 * A spec says how one tensor is divided over T ranks: replicated whole, absent, owned (whole on
 * the ranks that hold one unit of an evenly distributed axis, absent from the others: a routed
 * expert's tensor under expert parallelism), or split along one axis. A split axis is made of segments (fused blocks such as
 * [Q|K|V]), each made of units of equal width (a head, or one element; segments may have
 * different widths, as key heads and value heads do). Each segment's units are
 * distributed over the ranks on their own, and a rank's pieces of every segment are packed back
 * to back in segment order. Quantized companions are described in LOGICAL features with a
 * divisor: `div` logical elements per stored element along the axis (128 for an FP8 block
 * scale, 2 for packed FP4), so a cut that falls inside a stored element is refused.
 *
 * This module turns (tensor, spec, T, r) into the local shape and a gather program: `outer`
 * repetitions, `stride` source bytes apart, each copying the same list of pieces (source byte
 * runs relative to the tensor's start, or zero fill). It knows nothing of files or FUSE.
 */
#ifndef TP_SPEC_H
#define TP_SPEC_H

#include <stdint.h>

#include "st_format.h"
#include "tp_err.h"

#define TP_MAX_SEG 16    /* segments in one split axis */
#define TP_MAX_T 1024    /* ranks */
#define TP_MAX_PIECES (2 * TP_MAX_SEG)
#define TP_ZERO UINT64_MAX /* tp_piece.off of a zero-fill piece */

typedef enum tp_kind {
	TP_REPLICATE = 0, /* the whole tensor on every rank */
	TP_SPLIT,         /* a share of one axis on every rank */
	TP_ABSENT,        /* not on this rank (expert parallelism); tp_share is not used */
	TP_OWNED,         /* whole on the ranks whose share of seg[0] units (distributed like a
	                   * split's) holds unit `owner`, absent from every other rank */
} tp_kind;

/* Distributions a split allows besides the even one (units % T == 0). */
enum {
	TP_UNEVEN = 1u << 0, /* units >= T: the first units % T ranks get one more */
	TP_GROUPS = 1u << 1, /* units < T, T % units == 0: rank r keeps unit floor(r / (T / units)) */
	TP_EXPERT = 1u << 2, /* a routed expert's tensor (the plan's experts declaration): changes no
	                      * cut; refusals suggest expert parallelism (--ep) and layouts count it */
	TP_EP_RR = 1u << 3,  /* TP_OWNED: unit `owner` is on rank owner % T (vLLM's round_robin expert
	                      * placement), not on the rank whose share of the units holds it */
};

typedef struct tp_spec {
	tp_kind kind;
	uint32_t axis;             /* split axis, 0 <= axis < ndim */
	uint32_t nseg;             /* 1..TP_MAX_SEG */
	uint64_t seg[TP_MAX_SEG];  /* units in each segment */
	uint64_t unit;             /* logical elements per unit (>= 1) */
	uint64_t segu[TP_MAX_SEG]; /* per-segment unit width; 0 means `unit` */
	uint64_t div;              /* logical elements per stored element on the axis (>= 1) */
	uint32_t flags;            /* TP_UNEVEN | TP_GROUPS */
	uint64_t pad_to;           /* > 1: pad each segment's units up to a multiple, zero-filled */
	uint64_t owner;            /* TP_OWNED: the unit (expert index) the tensor belongs to */
} tp_spec;

/* One rank's share of one segment, in units: real units [first, first + count), then `zeros`
 * units of zero padding. */
typedef struct tp_share {
	uint64_t first, count, zeros;
} tp_share;

/* A source byte run relative to the tensor's first byte (or TP_ZERO for zero fill). */
typedef struct tp_piece {
	uint64_t off;
	uint64_t len;
} tp_piece;

/* One tensor cut for one rank. Local bytes = for o in [0, outer): the pieces, in order, read
 * at source offset begin + o * stride + piece.off. */
typedef struct tp_cut {
	int absent;                  /* 1: the tensor is not on this rank (TP_OWNED); nothing else is set */
	uint32_t ndim;
	uint64_t shape[ST_MAX_DIMS]; /* local shape */
	uint64_t size;               /* local bytes = outer * rep */
	uint64_t outer, stride, rep; /* rep = sum of piece lengths */
	uint32_t np;
	tp_piece piece[TP_MAX_PIECES];
} tp_cut;

/* A spec that keeps the whole tensor. */
tp_spec tp_spec_replicate(void);
/* A split of `axis` into `units` units of width `unit` (one segment, even only). */
tp_spec tp_spec_split(uint32_t axis, uint64_t units, uint64_t unit);
/* A tensor that belongs whole to unit `owner` of `units` distributed evenly over the ranks
 * (expert `owner` of E routed experts: rank r holds experts [r*E/T, (r+1)*E/T)). */
tp_spec tp_spec_owned(uint64_t units, uint64_t owner);

/* Distributes `units` over T ranks per the spec's flags and padding; fills rank r's share.
 * On failure returns -1 with a message that starts with ctx and says why. */
int tp_share_of(uint64_t units, const tp_spec *s, uint32_t T, uint32_t r, tp_share *out,
		const char *ctx, tp_err *e);

/* Whether s cuts every rank the same way, only shifted by a multiple of the rank, on ranks
 * 0 .. T-2 (T >= 4): replicated, absent, or split with every segment dividing evenly over T and
 * no padding. Then every check tp_cut_tensor makes on a rank in between is a divisibility test
 * of an offset affine in r (true at r = 0 and 1, so for all r) or a bound that rank T-1 (the
 * largest offsets) meets: cutting ranks 0, 1 and T-1 checks them all, and rank r's pieces lie
 * at rank 0's + r x (rank 1's - rank 0's) (see layout.h, tp_layout_from_affine). */
int tp_spec_affine(const tp_spec *s, uint32_t T);

/* Cuts tensor t for rank r of T. ctx prefixes messages (e.g. "file: tensor 'x'"). Checks that
 * the spec matches the shape (axis in range, segments x unit = the axis, divisor), that every
 * cut lands on a stored element and a byte boundary. An owned tensor is cut whole on the ranks
 * that hold its unit and comes back with c->absent = 1 (size 0, no pieces) on the others; its
 * units must divide over T (or the spec's flags allow the distribution) and owner < units.
 * A TP_ABSENT spec has no cut (refused). Only c->piece[0 .. c->np) is set. Returns 0 or -1
 * with a message. */
int tp_cut_tensor(const st_tensor *t, const tp_spec *s, uint32_t T, uint32_t r, tp_cut *c,
		  const char *ctx, tp_err *e);

/* Writes into buf the T in [1, maxT] for which every rank can cut t under s, as "1, 2, 4" (at most
 * 12 values), or "none". For messages that say what would work. */
void tp_spec_working_ts(const st_tensor *t, const tp_spec *s, uint32_t maxT, char *buf, size_t n);

#endif
