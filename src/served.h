/* served.h: a served file made of pieces of several source files, and its range mapper.
 *
 * A rank folder's file mirrors one source file (layout.h). A served file is more general: a
 * local header and tensors, each made of pieces, where a piece is a cut (tp_spec, as in a
 * layout) of one source tensor in any of the source files the served file reads. A served
 * tensor is its pieces concatenated along the first axis (q, k and v's local cuts as one qkv),
 * optionally stacked over a new first axis (every expert's gate and up cuts as one [E, 2I/T, H]
 * tensor), or a constant (bytes the caller gives, such as an F32 scalar 1.0).
 *
 * Built once per (served file, rank) from the parsed source headers and a description of each
 * tensor. tp_served_map turns any (offset, length) of the file into ordered runs, each naming
 * the source it reads (an index into the file's table of sources), plus header, zero-fill and
 * constant runs, in O(log n + runs emitted) like tp_map, whose inner loop it shares
 * (map_emit.h). A layout (one source, one piece per tensor) is the special case: described that
 * way, a served file has the same header bytes and the same runs. Pure: no I/O.
 */
#ifndef TP_SERVED_H
#define TP_SERVED_H

#include <stddef.h>
#include <stdint.h>

#include "layout.h"
#include "spec.h"
#include "st_format.h"
#include "tp_err.h"

/* One piece of a served tensor: source tensor `tensor` of source `file` (indexes into the
 * served file's table of sources and that source's header t[]), cut for the rank by `spec`.
 * deint: 0, or N (even, >= 2): the cut's local rows (along its first axis), in blocks of N, each
 * served as its even rows then its odd rows ([N/2, 2] transposed to [2, N/2]: vLLM's Llama 4
 * q_proj / k_proj, whose rotary pairs it turns from interleaved to half-split while loading); a
 * cut whose rows do not fill whole blocks is refused, and so is deint on a widened, transposed
 * or stacked tensor. */
typedef struct tp_pdesc {
	uint32_t file;
	uint32_t tensor;
	tp_spec spec;
	uint64_t deint;
} tp_pdesc;

/* A served tensor as the caller describes it.
 * - pieces: pieces[0 .. npieces) cut and concatenated along the first axis (they must agree in
 *   dtype and in every other local dimension; a lone piece may be a scalar, and several scalar
 *   pieces make a vector of them: vLLM's per-shard scale slots, [3] from q's, k's, v's 0-d scale);
 * - stacked: with nstack > 0, pieces holds nstack groups of npieces (group e at
 *   pieces[e x npieces]), each concatenated as above, and the groups (all of the same local
 *   shape) stacked along a new first axis of length nstack. A piece that is not on this rank
 *   (TP_ABSENT, or TP_OWNED by another rank's unit) drops its group (the local stack holds this
 *   rank's experts: [E_local, ...]); a group only partly on this rank is refused; a tensor none
 *   of whose pieces is on this rank is left out of the file;
 * - constant: with cbytes set (and npieces 0), a tensor of dtype/ndim/shape whose bytes are
 *   cbytes[0 .. its size) on every rank.
 * - widened: with to_f32 set, a tensor of BF16 or F16 pieces is served as F32, every value
 *   widened exactly (an engine that holds a parameter in F32 where checkpoints store BF16:
 *   vLLM's MoE routers, Qwen3-Next's A_log); F32 pieces are served as they are, other dtypes
 *   are refused.
 * - reshaped: with rs_ndim > 0, the tensor (its bytes unchanged, row-major) is served with shape
 *   rs_shape[0 .. rs_ndim), where an entry 0 is the tensor's own dimension at that axis (ONNX's
 *   Reshape: vLLM's gpt-oss MXFP4 blocks [E, 2I/T, H/32, 16] served [0, 0, -1]) and one may be -1:
 *   what the others leave of its elements
 *   (vLLM's KDA A_log, a [1, 1, heads/T, 1] parameter where GLM-5.3 checkpoints store [heads]).
 *   A shape that does not hold the tensor's elements is refused.
 * - transposed: with transpose set, the tensor's last two axes are swapped ([..., R, C] served
 *   [..., C, R], after any reshape): vLLM's gpt-oss experts, whose w13_weight [E, 2I/T, H] is the
 *   transpose of the checkpoint's gate_up_proj [E, H, 2I] cut by columns. It takes one piece
 *   (no concatenation, no stack, no widening) whose local rows of C elements each lie whole in
 *   one row of its cut, or whose cut rows are exactly C elements in two pieces of C / 2 (two
 *   segments: Llama 4's gate_up_proj [E, H, gate | up] cut per half, served [E, 2I/T, H]);
 *   anything else is refused.
 * - rank 0 only: with rank0_only set, ranks other than 0 serve zeros of the same dtype and shape
 *   (a row-parallel bias the engine adds once: vLLM's gpt-oss w2_bias, loaded whole on rank 0 and
 *   zeroed on the others).
 * name (and cbytes, copied at build) must outlive the served file. */
typedef struct tp_sdesc {
	const char *name;
	const tp_pdesc *pieces;
	uint32_t npieces;
	uint32_t nstack;
	const uint8_t *cbytes;
	int to_f32;                   /* widened to F32 (see above) */
	uint32_t rs_ndim;             /* reshaped (see above): 0, or the served shape's rank */
	int64_t rs_shape[ST_MAX_DIMS];
	int transpose;                /* the last two axes swapped (see above) */
	int rank0_only;               /* zeros on ranks other than 0 (see above) */
	st_dtype dtype;               /* constant only */
	uint32_t ndim;                /* constant only */
	uint64_t shape[ST_MAX_DIMS];  /* constant only */
} tp_sdesc;

#define TP_PART_CONST UINT32_MAX /* tp_part.src of a constant */
#define TP_PART_ZERO (UINT32_MAX - 1) /* tp_part.src of zeros (a rank0_only tensor on another rank) */

/* Whether a part's src names a source (neither a constant nor zeros). */
#define TP_PART_READS(src) ((src) < TP_PART_ZERO)

/* One stretch of a served tensor's bytes: one piece's cut (outer rows of the pieces
 * pieces[pi .. pi + np), row o read at base + o x stride of source src) or a constant (size
 * bytes at offset base of the constants). */
typedef struct tp_part {
	uint64_t off;    /* offset in the data buffer */
	uint64_t size;   /* bytes (= outer x rep for a cut) */
	uint64_t base;   /* a cut: file offset of the source tensor's first byte; a constant: its
	                  * offset in the constants */
	uint64_t outer, stride, rep;
	uint32_t src;    /* index into the table of sources, TP_PART_CONST or TP_PART_ZERO */
	uint32_t pi, np;
	uint32_t widen;  /* 0, or the source dtype (ST_BF16, ST_F16) of a cut served widened to F32:
	                  * then size is twice the cut's bytes, and outer/rep/pieces are the cut's */
	uint32_t tes;    /* 0, or the element size of a transposed cut: its matrices [trows, tcols]
	                  * served [tcols, trows] (one piece, whole rows of tcols elements; or two
	                  * pieces of tcols / 2 elements each, a row of the cut: segments, such as
	                  * Llama 4's [gate | up] columns, each half of a served matrix's rows) */
	uint32_t trows, tcols;
	uint64_t dblk;   /* 0, or the bytes of a deinterleaved block (tp_pdesc.deint rows of drow
	                  * bytes): output row j of a block is the block's row 2j (j < N/2), else
	                  * row 2(j - N/2) + 1 */
	uint64_t drow;
} tp_part;

/* One served tensor: its entry in the local header and its parts. */
typedef struct tp_stensor {
	const char *name;
	st_dtype dtype;
	uint32_t ndim;
	uint64_t shape[ST_MAX_DIMS]; /* local shape */
	uint64_t off, size;          /* in the data buffer */
	uint32_t part0, nparts;      /* parts[part0 .. part0 + nparts) */
} tp_stensor;

typedef struct tp_served {
	uint32_t nsrc;        /* sources the table holds (runs name src < nsrc) */
	uint32_t rank, T;
	uint32_t ep_rank, ep_N; /* a routed expert's piece (TP_EXPERT) is cut for EP rank ep_rank of ep_N
	                         * (tp_served_build_ep); ep_N 0: for rank of T like any piece */
	tp_stensor *t;        /* served tensors in data order (the writer's: dtype size descending,
	                       * then name) */
	size_t n;
	tp_part *parts;       /* every tensor's parts, in data order */
	size_t nparts;
	tp_piece *pieces;
	size_t npieces;
	uint8_t *consts;      /* the constants' bytes (owned) */
	uint64_t const_size;
	const st_meta *meta;  /* __metadata__ entries (borrowed), then xmeta's (see st_w_begin_x) */
	size_t nmeta;
	const st_meta *xmeta;
	size_t nxmeta;
	uint64_t hdr_size;    /* 8-byte prefix + JSON + padding, a multiple of 8 */
	uint64_t data_size;
	uint64_t size;        /* hdr_size + data_size: the file's size */
	uint64_t local_size;  /* hdr_size + const_size: the bytes tp_served_local writes */
} tp_served;

/* Builds rank r's (of T) served file from the nsrc parsed source headers src[] and the n
 * tensor descriptions d[], with __metadata__ meta[0 .. nmeta) then xmeta[0 .. nxmeta) (borrowed,
 * written as st_w_begin_x writes them). fname prefixes error messages, which name the served
 * tensor, its piece (source and tensor) and the rule: a piece that cannot be cut (tp_cut_tensor's
 * message), pieces that disagree in dtype or in a dimension other than the first, a concatenated
 * scalar, groups of different shapes, a group partly on this rank, a source or tensor index out
 * of range, a constant whose shape has no whole bytes, two tensors of one name, a header past
 * ST_HEADER_MAX. Returns 0, or -1 with e set. */
int tp_served_build(const st_header *const *src, uint32_t nsrc, const tp_sdesc *d, size_t n, const st_meta *meta,
		    size_t nmeta, const st_meta *xmeta, size_t nxmeta, uint32_t T, uint32_t r, const char *fname,
		    tp_served *S, tp_err *e);

/* As tp_served_build, but a piece of a routed expert (its spec flagged TP_EXPERT: the plan's experts
 * declaration under --ep) is cut for EP rank ep_r of ep_N instead of rank r of T: vLLM's data
 * parallelism with expert parallelism, whose MoE layers place the experts over D x T ranks while
 * every other tensor is TP rank r's of T. */
int tp_served_build_ep(const st_header *const *src, uint32_t nsrc, const tp_sdesc *d, size_t n, const st_meta *meta,
		       size_t nmeta, const st_meta *xmeta, size_t nxmeta, uint32_t T, uint32_t r, uint32_t ep_N,
		       uint32_t ep_r, const char *fname, tp_served *S, tp_err *e);
void tp_served_free(tp_served *S);

/* Writes the local header (S->hdr_size bytes) into buf. Deterministic. */
void tp_served_header(const tp_served *S, char *buf);

/* Writes the file's local bytes (S->local_size): the header, then the constants. TP_RUN_HDR
 * and TP_RUN_CONST runs read from them (the gather's hdr). */
void tp_served_local(const tp_served *S, uint8_t *buf);

/* Maps bytes [off, off + len) of the served file (clamped to its size) to at most cap runs, in
 * order, merging runs that continue each other in one source, as tp_map does: TP_RUN_SRC runs
 * name their source (src), TP_RUN_CONST runs are offsets into the local bytes. *covered receives
 * the bytes the runs produce (less than asked when cap was reached or the file ended: call again
 * from off + *covered). A widened part's bytes are TP_RUN_WIDEN runs (and zero runs where its
 * pieces are padding), a transposed part's one TP_RUN_TRANSPOSE run, a rank0_only tensor's on
 * another rank zero runs. Returns the number of runs written. */
size_t tp_served_map(const tp_served *S, uint64_t off, uint64_t len, tp_run *out, size_t cap, uint64_t *covered);

#endif
