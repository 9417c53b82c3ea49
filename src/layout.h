/* layout.h: the bytes of one rank's view of one source file, and the range mapper.
 *
 * A layout is built once per (source file, rank) at mount time from the parsed source header
 * and one spec per tensor. It holds each local tensor's place in the rank file and its gather
 * program, and the size of the local header. tp_map turns any (offset, length) of the rank
 * file into the exact ordered runs that produce those bytes: header bytes, source byte runs,
 * zero fill. Its cost is O(log n + runs emitted), independent of the file's size.
 */
#ifndef TP_LAYOUT_H
#define TP_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#include "run.h"
#include "spec.h"
#include "st_format.h"
#include "tp_err.h"

typedef struct tp_ltensor {
	uint32_t src;       /* index into the source header's t[] */
	int32_t axis;       /* split axis, or -1 when the local shape is the source shape */
	uint64_t axis_len;  /* local length of that axis */
	uint64_t off;       /* offset in the local data buffer */
	uint64_t size;      /* local bytes */
	uint64_t outer;     /* gather program, see tp_cut */
	uint64_t stride;
	uint64_t rep;
	uint32_t pi, np;    /* pieces[pi .. pi + np) of the layout */
} tp_ltensor;

typedef struct tp_layout tp_layout;
struct tp_layout {
	const st_header *h;  /* the source header (borrowed, must outlive the layout) */
	uint32_t rank, T;
	tp_ltensor *t;       /* local tensors in local data order (writer's order) */
	size_t n;
	tp_piece *pieces;
	size_t npieces;
	uint64_t hdr_size;   /* 8-byte prefix + JSON + padding, a multiple of 8 */
	uint64_t tens_len;   /* bytes of the header's tensor entries (each after a comma), which
	                      * every layout sharing t shares: a rank's header size is counted from
	                      * it and its own __metadata__ alone */
	uint64_t data_size;
	uint64_t size;       /* hdr_size + data_size: the rank file's size */
	uint64_t split_bytes;/* local bytes of tensors whose spec splits them (or places them whole on
	                      * some ranks only: TP_OWNED) */
	uint64_t repl_bytes; /* local bytes of replicated tensors */
	uint64_t expert_bytes;/* local bytes of routed experts' tensors (specs flagged TP_EXPERT) */
	size_t nexpert;      /* how many of the local tensors those are */
	uint32_t *loc;       /* for each source tensor, its index in t[], or UINT32_MAX if absent */
	const st_meta *xmeta;/* extra __metadata__ entries (borrowed; tp_layout_set_meta), or NULL */
	size_t nxmeta;
	int borrowed;        /* t and loc belong to another layout of the same file (built with it
	                      * as `like`), which must outlive this one */
	const tp_layout *aff0, *aff1; /* or NULL; else this rank's pieces are not held: piece i lies at
	                      * aff0's + rank x (aff1's - aff0's) (tp_layout_from_affine; both must
	                      * outlive this one) */
};

/* Piece i of L's pieces (where L holds none, computed from its affine pair). */
static inline tp_piece tp_layout_piece(const tp_layout *L, size_t i)
{
	if (!L->aff0)
		return L->pieces[i];
	tp_piece p = L->aff0->pieces[i];
	if (p.off != TP_ZERO)
		p.off += (uint64_t)L->rank * (L->aff1->pieces[i].off - p.off);
	return p;
}

/* Builds rank r's layout of the file whose header is h, with specs[i] the spec of h->t[i]
 * (TP_ABSENT tensors, and TP_OWNED tensors of units another rank holds, are left out: the
 * local header does not name them; a rank left with no tensor gets a valid empty file). fname prefixes error messages; why (NULL, or one string
 * per tensor) says which rule gave each spec, for messages. */
int tp_layout_build(const st_header *h, const tp_spec *specs, const char *const *why, uint32_t T,
		    uint32_t r, const char *fname, tp_layout *L, tp_err *e);
void tp_layout_free(tp_layout *L);

/* The same, with order[] the tensors of h in the writer's order (tp_layout_order), computed once
 * for all ranks of a file instead of sorting per rank, and like (NULL, or another rank's layout of
 * the same file and specs): where this rank's local tensors are exactly like's (every replicated
 * tensor, every even split), L borrows like's t and loc and header size instead of holding its
 * own, so that only the pieces (which say where each rank's slice lies) cost memory per rank. */
int tp_layout_build_ordered(const st_header *h, const tp_spec *specs, const char *const *why, const uint32_t *order,
			    const tp_layout *like, uint32_t T, uint32_t r, const char *fname, tp_layout *L, tp_err *e);

/* Whether tp_spec_affine holds for every tensor of h (T >= 4). Then, with ranks 0, 1 and T-1
 * built (and checked) by tp_layout_build_ordered, each rank r in between holds the same local
 * tensors at the same places, every piece at rank 0's offset + r x (rank 1's - rank 0's). */
int tp_layout_affine(const st_header *h, const tp_spec *specs, uint32_t T);

/* Rank r's layout (1 < r < T-1) of a file for which tp_layout_affine holds, from the layouts
 * l0 and l1 of ranks 0 and 1 (l1 borrowing from l0): nothing is allocated, so a mount's
 * memory does not grow with its ranks. l0 and l1 must outlive L. Returns 0, or -1 when l1 does
 * not borrow from l0 (its local tensors differ: build L with tp_layout_build_ordered). */
int tp_layout_from_affine(const tp_layout *l0, const tp_layout *l1, uint32_t r, tp_layout *L);

/* The indexes of h's tensors in the writer's order (dtype size descending, then name); NULL when
 * out of memory. The caller frees it. */
uint32_t *tp_layout_order(const st_header *h);

/* Adds n extra __metadata__ entries (after the source's; an extra key replaces the source's
 * entry of that key) and updates hdr_size and size. x is borrowed: it must outlive L. */
void tp_layout_set_meta(tp_layout *L, const st_meta *x, size_t n);

/* Writes the local header (L->hdr_size bytes) into buf. Deterministic: the same layout always
 * gives the same bytes. */
void tp_layout_header(const tp_layout *L, char *buf);

/* Local shape of local tensor lt into shape[] (ST_MAX_DIMS); returns ndim. */
uint32_t tp_layout_shape(const tp_layout *L, const tp_ltensor *lt, uint64_t *shape);


/* Maps bytes [off, off + len) of the rank file (clamped to its size) to at most cap runs, in
 * order, merging runs that are adjacent in the source. *covered receives the number of bytes
 * the runs produce (less than requested when cap was reached or the file ended: call again
 * from off + *covered). Returns the number of runs written. */
size_t tp_map(const tp_layout *L, uint64_t off, uint64_t len, tp_run *out, size_t cap,
	      uint64_t *covered);

#endif
