/* layout.c: building rank layouts, writing local headers, and mapping byte ranges
 * (see layout.h). */
#include "layout.h"
#include "map_emit.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp_writer(const void *a, const void *b, void *ctx)
{
	const st_header *h = ctx;
	const st_tensor *x = &h->t[((const tp_ltensor *)a)->src], *y = &h->t[((const tp_ltensor *)b)->src];
	return st_writer_cmp(x->dtype, x->name, y->dtype, y->name);
}

void tp_layout_free(tp_layout *L)
{
	if (!L->borrowed) {
		free(L->t);
		free(L->loc);
	}
	free(L->pieces);
	memset(L, 0, sizeof *L);
}

uint32_t tp_layout_shape(const tp_layout *L, const tp_ltensor *lt, uint64_t *shape)
{
	const st_tensor *t = &L->h->t[lt->src];
	memcpy(shape, t->shape, sizeof t->shape);
	if (lt->axis >= 0)
		shape[lt->axis] = lt->axis_len;
	return t->ndim;
}

/* Writes (or, with w->p == NULL, counts) the local header; returns its size. */
static uint64_t write_header(const tp_layout *L, st_wbuf *w)
{
	st_w_begin_x(w, L->h->meta, L->h->nmeta, L->xmeta, L->nxmeta);
	for (size_t i = 0; i < L->n; i++) {
		const tp_ltensor *lt = &L->t[i];
		const st_tensor *t = &L->h->t[lt->src];
		uint64_t shape[ST_MAX_DIMS];
		uint32_t nd = tp_layout_shape(L, lt, shape);
		st_w_tensor(w, t->name, t->dtype, nd, shape, lt->off, lt->off + lt->size);
	}
	return st_w_end(w);
}

/* The bytes of L's tensor entries in its header, each after a comma (L->tens_len). */
static uint64_t count_tensors(const tp_layout *L)
{
	st_wbuf w = {.p = NULL, .entries = 1};
	for (size_t i = 0; i < L->n; i++) {
		const tp_ltensor *lt = &L->t[i];
		const st_tensor *t = &L->h->t[lt->src];
		uint64_t shape[ST_MAX_DIMS];
		uint32_t nd = tp_layout_shape(L, lt, shape);
		st_w_tensor(&w, t->name, t->dtype, nd, shape, lt->off, lt->off + lt->size);
	}
	return w.len;
}

/* The size write_header gives, counted from the metadata and L->tens_len: formatting a 200k
 * tensor header again for each of 128 ranks was most of the time of such a mount. */
static uint64_t count_header(const tp_layout *L)
{
	st_wbuf w = {.p = NULL};
	st_w_begin_x(&w, L->h->meta, L->h->nmeta, L->xmeta, L->nxmeta);
	uint64_t len = w.len + L->tens_len - (w.entries == 0 && L->n ? 1 : 0) + 1; /* + "}" */
	return (len + 7) / 8 * 8;
}

void tp_layout_set_meta(tp_layout *L, const st_meta *x, size_t n)
{
	L->xmeta = x;
	L->nxmeta = n;
	L->hdr_size = count_header(L);
	L->size = L->hdr_size + L->data_size;
}

void tp_layout_header(const tp_layout *L, char *buf)
{
	st_wbuf w = {.p = buf};
	write_header(L, &w);
}

static int cmp_order(const void *a, const void *b, void *ctx)
{
	const st_header *h = ctx;
	const st_tensor *x = &h->t[*(const uint32_t *)a], *y = &h->t[*(const uint32_t *)b];
	return st_writer_cmp(x->dtype, x->name, y->dtype, y->name);
}

uint32_t *tp_layout_order(const st_header *h)
{
	uint32_t *o = malloc((h->n ? h->n : 1) * sizeof *o);
	if (!o)
		return NULL;
	for (size_t i = 0; i < h->n; i++)
		o[i] = (uint32_t)i;
	qsort_r(o, h->n, sizeof *o, cmp_order, (void *)h);
	return o;
}

int tp_layout_build(const st_header *h, const tp_spec *specs, const char *const *why, uint32_t T,
		    uint32_t r, const char *fname, tp_layout *L, tp_err *e)
{
	return tp_layout_build_ordered(h, specs, why, NULL, NULL, T, r, fname, L, e);
}

int tp_layout_build_ordered(const st_header *h, const tp_spec *specs, const char *const *why, const uint32_t *order,
			    const tp_layout *like, uint32_t T, uint32_t r, const char *fname, tp_layout *L, tp_err *e)
{
	memset(L, 0, sizeof *L);
	L->h = h;
	L->rank = r;
	L->T = T;
	size_t cap = 16;
	L->t = calloc(h->n ? h->n : 1, sizeof *L->t);
	L->pieces = malloc(cap * sizeof *L->pieces);
	L->loc = malloc((h->n ? h->n : 1) * sizeof *L->loc);
	if (!L->t || !L->pieces || !L->loc) {
		tp_layout_free(L);
		return tp_fail(e, TP_ENOMEM, "%s: out of memory building rank %u", fname, r);
	}
	/* With an order, the source tensors are visited in source order (their specs and headers
	 * read in sequence, not at random: at 200k tensors and many ranks the cache misses were
	 * most of the time) and each is written into its writer-order slot; empty slots are
	 * squeezed out after. The first failure in writer order is the one reported, as before. */
	uint32_t *slot = NULL;
	if (order && h->n) {
		slot = malloc(h->n * sizeof *slot);
		if (!slot) {
			tp_layout_free(L);
			return tp_fail(e, TP_ENOMEM, "%s: out of memory building rank %u", fname, r);
		}
		for (size_t k = 0; k < h->n; k++)
			slot[order[k]] = (uint32_t)k;
	}
	size_t fail = SIZE_MAX;
	for (size_t i = 0; i < h->n && (slot || fail == SIZE_MAX); i++) {
		tp_ltensor *lt = slot ? &L->t[slot[i]] : &L->t[L->n];
		lt->src = UINT32_MAX; /* empty unless filled below */
		if (specs[i].kind == TP_ABSENT)
			continue;
		tp_cut c;
		if (tp_cut_tensor(&h->t[i], &specs[i], T, r, &c, "", NULL) < 0) {
			if (fail == SIZE_MAX || (slot && slot[i] < slot[fail]))
				fail = i;
			continue;
		}
		if (c.absent || fail != SIZE_MAX)
			continue; /* another rank's expert, or a failure already */
		if (L->npieces + c.np > cap) {
			while (L->npieces + c.np > cap)
				cap *= 2;
			tp_piece *np = realloc(L->pieces, cap * sizeof *np);
			if (!np) {
				free(slot);
				tp_layout_free(L);
				return tp_fail(e, TP_ENOMEM, "%s: out of memory building rank %u", fname, r);
			}
			L->pieces = np;
		}
		if (!slot)
			L->n++;
		lt->src = (uint32_t)i;
		lt->axis = specs[i].kind == TP_SPLIT ? (int32_t)specs[i].axis : -1;
		lt->axis_len = lt->axis >= 0 ? c.shape[lt->axis] : 0;
		lt->size = c.size;
		lt->outer = c.outer;
		lt->stride = c.stride;
		lt->rep = c.rep;
		lt->pi = (uint32_t)L->npieces;
		lt->np = c.np;
		memcpy(L->pieces + L->npieces, c.piece, c.np * sizeof *c.piece);
		L->npieces += c.np;
		if (specs[i].kind == TP_REPLICATE)
			L->repl_bytes += c.size;
		else
			L->split_bytes += c.size;
		if (specs[i].flags & TP_EXPERT) {
			L->expert_bytes += c.size;
			L->nexpert++;
		}
	}
	free(slot);
	if (fail != SIZE_MAX) {
		/* again with the context for the message (formatting it for every tensor of every
		 * rank up front was most of the time of a large mount) */
		size_t i = fail;
		tp_cut c;
		char ctx[TP_ERR_MSG];
		if (why && why[i])
			tp_fmt(ctx, sizeof ctx, "%s: tensor '%s' (%s)", fname, h->t[i].name, why[i]);
		else
			tp_fmt(ctx, sizeof ctx, "%s: tensor '%s'", fname, h->t[i].name);
		tp_cut_tensor(&h->t[i], &specs[i], T, r, &c, ctx, e);
		if (e && e->code == TP_EPLAN) {
			char ts[96];
			tp_spec_working_ts(&h->t[i], &specs[i], 64, ts, sizeof ts);
			size_t l = strlen(e->msg);
			tp_fmt(e->msg + l, sizeof e->msg - l, "; this tensor can be split for T = %s%s", ts,
			       (specs[i].flags & TP_EXPERT) && specs[i].kind != TP_OWNED ? "; or serve the experts with expert parallelism (--ep)" : "");
		}
		tp_layout_free(L);
		return -1;
	}
	if (order) { /* squeeze out the empty slots, keeping writer order */
		size_t m = 0;
		for (size_t k = 0; k < h->n; k++)
			if (L->t[k].src != UINT32_MAX)
				L->t[m++] = L->t[k];
		L->n = m;
	}
	if (!order)
		qsort_r(L->t, L->n, sizeof *L->t, cmp_writer, (void *)h);
	uint64_t off = 0;
	for (size_t i = 0; i < h->n; i++)
		L->loc[i] = UINT32_MAX;
	for (size_t i = 0; i < L->n; i++) {
		L->t[i].off = off;
		off += L->t[i].size;
		L->loc[L->t[i].src] = (uint32_t)i;
	}
	L->data_size = off;
	tp_piece *np = realloc(L->pieces, (L->npieces ? L->npieces : 1) * sizeof *np); /* trimmed to size */
	if (np)
		L->pieces = np;
	if (like && !like->borrowed && like->h == h && like->n == L->n && like->data_size == L->data_size &&
	    !memcmp(like->t, L->t, L->n * sizeof *L->t)) {
		/* the same local tensors (names, shapes, places, programs): borrow them and the header
		 * size; keep only this rank's pieces */
		free(L->t);
		free(L->loc);
		L->t = like->t;
		L->loc = like->loc;
		L->borrowed = 1;
		L->hdr_size = like->hdr_size;
		L->tens_len = like->tens_len;
		L->size = like->size;
		L->split_bytes = like->split_bytes;
		L->repl_bytes = like->repl_bytes;
		return 0;
	}
	L->tens_len = count_tensors(L);
	L->hdr_size = count_header(L);
	if (L->hdr_size - ST_PREFIX > ST_HEADER_MAX) {
		tp_layout_free(L);
		return tp_fail(e, TP_ELIMIT, "%s: rank %u's header would exceed %llu bytes", fname, r,
			       ST_HEADER_MAX);
	}
	L->size = L->hdr_size + L->data_size;
	return 0;
}

int tp_layout_affine(const st_header *h, const tp_spec *specs, uint32_t T)
{
	if (T < 4)
		return 0;
	for (size_t i = 0; i < h->n; i++)
		if (!tp_spec_affine(&specs[i], T))
			return 0;
	return 1;
}

int tp_layout_from_affine(const tp_layout *l0, const tp_layout *l1, uint32_t r, tp_layout *L)
{
	if (!l1->borrowed || l1->t != l0->t || l0->borrowed || l0->aff0 || l1->aff0 || r < 2 || r + 1 >= l0->T)
		return -1;
	*L = *l1;
	L->rank = r;
	L->pieces = NULL;
	L->aff0 = l0;
	L->aff1 = l1;
	return 0;
}

/* Index of the local tensor holding data byte x: the last tensor with off <= x and size > 0. */
static size_t find_tensor(const tp_layout *L, uint64_t x)
{
	size_t lo = 0, hi = L->n;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (L->t[mid].off <= x)
			lo = mid + 1;
		else
			hi = mid;
	}
	size_t i = lo ? lo - 1 : 0;
	while (i < L->n && L->t[i].off + L->t[i].size <= x)
		i++; /* skip empty tensors sharing the offset */
	return i;
}

size_t tp_map(const tp_layout *L, uint64_t off, uint64_t len, tp_run *out, size_t cap,
	      uint64_t *covered)
{
	size_t n = 0;
	*covered = 0;
	if (off >= L->size || !len || !cap)
		return 0;
	if (len > L->size - off)
		len = L->size - off;
	uint64_t done = 0;
	if (off < L->hdr_size) {
		uint64_t l = L->hdr_size - off < len ? L->hdr_size - off : len;
		tp_emit(out, cap, &n, TP_RUN_HDR, 0, off, l);
		done = l;
	}
	if (done == len) {
		*covered = done;
		return n;
	}
	uint64_t x = off + done - L->hdr_size; /* data offset */
	uint64_t src_data = L->h->data_start;
	for (size_t i = find_tensor(L, x); i < L->n && done < len; i++) {
		const tp_ltensor *lt = &L->t[i];
		if (!lt->size)
			continue;
		/* the pieces are rank 0's, shifted where L is affine (tp_layout_piece, inlined) */
		const tp_piece *pc = (L->aff0 ? L->aff0->pieces : L->pieces) + lt->pi;
		const tp_piece *pc1 = L->aff0 ? L->aff1->pieces + lt->pi : NULL;
		uint64_t rel = x - lt->off, want = len - done;
		if (want > lt->size - rel)
			want = lt->size - rel;
		uint64_t l = tp_emit_cut(out, cap, &n, 0, src_data + L->h->t[lt->src].begin, pc, pc1, L->rank, lt->np,
					 lt->outer, lt->stride, lt->rep, rel, want);
		done += l;
		x += l;
		if (l < want)
			break; /* out is full */
	}
	*covered = done;
	return n;
}
