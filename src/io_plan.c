/* io_plan.c: page-touch minima, prefetch ranges and rank lists (see io_plan.h). */
#include "io_plan.h"

#include <stdlib.h>
#include <string.h>

int tp_ranks_parse(const char *list, uint32_t T, uint8_t *sel, uint32_t *count, tp_err *e)
{
	memset(sel, 0, T);
	*count = 0;
	if (!list || !*list)
		return tp_fail(e, TP_EINVAL, "--ranks: the list is empty (give ranks such as 0,3 or 8-15)");
	const char *p = list;
	for (;;) {
		uint64_t lo = 0, hi;
		const char *q = p;
		while (*q >= '0' && *q <= '9' && lo <= TP_MAX_T)
			lo = lo * 10 + (uint64_t)(*q++ - '0');
		if (q == p)
			return tp_fail(e, TP_EINVAL, "--ranks '%s': expected a rank number at '%s' (give ranks such as 0,3 or 8-15)",
				       list, p);
		hi = lo;
		if (*q == '-') {
			const char *r = ++q;
			hi = 0;
			while (*q >= '0' && *q <= '9' && hi <= TP_MAX_T)
				hi = hi * 10 + (uint64_t)(*q++ - '0');
			if (q == r)
				return tp_fail(e, TP_EINVAL, "--ranks '%s': a range needs an end at '%s'", list, r);
			if (hi < lo)
				return tp_fail(e, TP_EINVAL, "--ranks '%s': the range %llu-%llu ends below its start", list,
					       (unsigned long long)lo, (unsigned long long)hi);
		}
		if (*q >= '0' && *q <= '9')
			return tp_fail(e, TP_EINVAL, "--ranks '%s': rank number too large at '%s'", list, p);
		if (*q != ',' && *q)
			return tp_fail(e, TP_EINVAL, "--ranks '%s': unexpected '%c' (give ranks such as 0,3 or 8-15)", list, *q);
		if (hi >= T)
			return tp_fail(e, TP_EINVAL, "--ranks '%s': rank %llu is out of range for --tp %u (ranks are 0..%u)", list,
				       (unsigned long long)hi, T, T - 1);
		for (uint64_t r = lo; r <= hi; r++) {
			if (sel[r])
				return tp_fail(e, TP_EINVAL, "--ranks '%s': rank %llu is named twice", list, (unsigned long long)r);
			sel[r] = 1;
			(*count)++;
		}
		if (!*q)
			return 0;
		p = q + 1;
	}
}

/* Counts a stream of source intervals given in order of their starts: union bytes and pages. */
typedef struct acc {
	uint64_t page;
	uint64_t end;  /* end of the union so far */
	uint64_t pend; /* pages below this index are counted */
	uint64_t bytes, pages;
} acc;

static void add(acc *c, uint64_t a, uint64_t b)
{
	if (a < c->end)
		a = c->end;
	if (a >= b)
		return;
	c->bytes += b - a;
	c->end = b;
	uint64_t p0 = a / c->page, p1 = (b - 1) / c->page + 1;
	if (p0 < c->pend)
		p0 = c->pend;
	if (p0 < p1) {
		c->pages += p1 - p0;
		c->pend = p1;
	}
}

static int cmp_piece(const void *x, const void *y)
{
	const tp_piece *a = x, *b = y;
	return a->off < b->off ? -1 : a->off > b->off;
}

/* One cut of a source tensor that some file reads: row o at base + o x stride, pieces pc[0 .. np)
 * of each row (TP_ZERO pieces read nothing). */
typedef struct cut {
	uint64_t base, outer, stride;
	const tp_piece *pc;
	uint32_t np;
} cut;

/* Adds to c the union of cuts cs[0 .. n) of one source tensor (all with the same base; c has seen
 * only bytes below it). pc: room for every piece of the cuts. Where the cuts agree on the rows
 * (every layout of one file, every rank's part of one view), one row's pieces are merged and
 * every row walked once; else every interval of every cut is sorted. Returns 0, or -1 (out of
 * memory) with e set. */
static int union_cuts(acc *c, const cut *cs, size_t n, tp_piece *pc, tp_err *e)
{
	uint64_t outer = 0, stride = 0, base = n ? cs[0].base : 0;
	int same = 1, any = 0;
	size_t np = 0, rows = 0;
	for (size_t k = 0; k < n; k++) {
		if (!cs[k].outer)
			continue;
		if (any && (cs[k].outer != outer || cs[k].stride != stride))
			same = 0;
		outer = cs[k].outer;
		stride = cs[k].stride;
		any = 1;
		rows += cs[k].outer * cs[k].np;
		for (uint32_t j = 0; j < cs[k].np; j++)
			if (cs[k].pc[j].off != TP_ZERO && cs[k].pc[j].len)
				pc[np++] = cs[k].pc[j];
	}
	if (!any)
		return 0;
	if (same) {
		/* one row's pieces, merged; then every row in order */
		qsort(pc, np, sizeof *pc, cmp_piece);
		size_t m = 0;
		for (size_t j = 0; j < np; j++) {
			if (m && pc[j].off <= pc[m - 1].off + pc[m - 1].len) {
				uint64_t end = pc[j].off + pc[j].len;
				if (end > pc[m - 1].off + pc[m - 1].len)
					pc[m - 1].len = end - pc[m - 1].off;
			} else {
				pc[m++] = pc[j];
			}
		}
		if (m == 1 && pc[0].off == 0 && pc[0].len == stride) {
			add(c, base, base + outer * stride);
			return 0;
		}
		for (uint64_t o = 0; o < outer; o++)
			for (size_t j = 0; j < m; j++)
				add(c, base + o * stride + pc[j].off, base + o * stride + pc[j].off + pc[j].len);
		return 0;
	}
	/* the cuts disagree on the rows: every interval of every cut, sorted */
	tp_piece *all = malloc((rows ? rows : 1) * sizeof *all);
	if (!all)
		return tp_fail(e, TP_ENOMEM, "out of memory");
	size_t na = 0;
	for (size_t k = 0; k < n; k++)
		for (uint64_t o = 0; o < cs[k].outer; o++)
			for (uint32_t j = 0; j < cs[k].np; j++)
				if (cs[k].pc[j].off != TP_ZERO && cs[k].pc[j].len)
					all[na++] = (tp_piece){base + o * cs[k].stride + cs[k].pc[j].off, cs[k].pc[j].len};
	qsort(all, na, sizeof *all, cmp_piece);
	for (size_t j = 0; j < na; j++)
		add(c, all[j].off, all[j].off + all[j].len);
	free(all);
	return 0;
}

int tp_io_need_of(const tp_layout *lay, uint32_t T, const uint8_t *sel, uint64_t page, tp_io_need *out,
		  tp_err *e)
{
	memset(out, 0, sizeof *out);
	if (!T || !page)
		return 0;
	const st_header *h = lay[0].h;
	acc c = {.page = page};
	tp_piece *pieces = malloc((size_t)T * TP_MAX_PIECES * sizeof *pieces), *pc = malloc((size_t)T * TP_MAX_PIECES * sizeof *pc);
	cut *cs = malloc((size_t)T * sizeof *cs);
	int rc = pieces && pc && cs ? 0 : tp_fail(e, TP_ENOMEM, "out of memory");
	for (size_t k = 0; rc == 0 && k < h->n; k++) {
		size_t n = 0, np = 0;
		for (uint32_t r = 0; r < T; r++) {
			if ((sel && !sel[r]) || lay[r].loc[k] == UINT32_MAX)
				continue;
			const tp_ltensor *lt = &lay[r].t[lay[r].loc[k]];
			cs[n] = (cut){h->data_start + h->t[k].begin, lt->outer, lt->stride, pieces + np, lt->np};
			for (uint32_t j = 0; j < lt->np; j++)
				pieces[np++] = tp_layout_piece(&lay[r], lt->pi + j);
			n++;
		}
		rc = union_cuts(&c, cs, n, pc, e);
	}
	free(pieces);
	free(pc);
	free(cs);
	out->bytes = c.bytes;
	out->pages = c.pages;
	return rc;
}

static int cmp_cut(const void *x, const void *y)
{
	const cut *a = x, *b = y;
	return a->base < b->base ? -1 : a->base > b->base;
}

int tp_io_need_served(const tp_served *vs, uint32_t T, size_t np, const uint8_t *sel, const uint32_t *const *node,
		      uint32_t nnodes, uint64_t page, tp_io_need *out, tp_err *e)
{
	memset(out, 0, (size_t)nnodes * sizeof *out);
	size_t *cnt = calloc((size_t)nnodes + 1, sizeof *cnt), total = 0, most = 0;
	if (!cnt)
		return tp_fail(e, TP_ENOMEM, "out of memory");
	for (uint32_t r = 0; r < T; r++) /* how many cuts read each source */
		for (size_t p = 0; (!sel || sel[r]) && p < np; p++) {
			const tp_served *S = &vs[(size_t)r * np + p];
			for (size_t k = 0; k < S->nparts; k++)
				if (TP_PART_READS(S->parts[k].src))
					cnt[node[(size_t)r * np + p][S->parts[k].src] + 1]++, total++;
		}
	for (uint32_t g = 0; g < nnodes; g++) /* cnt[g]: where source g's cuts start */
		cnt[g + 1] += cnt[g];
	cut *cs = malloc((total ? total : 1) * sizeof *cs);
	size_t *fill = malloc(((size_t)nnodes + 1) * sizeof *fill);
	if (!cs || !fill) {
		free(cs);
		free(fill);
		free(cnt);
		return tp_fail(e, TP_ENOMEM, "out of memory");
	}
	memcpy(fill, cnt, ((size_t)nnodes + 1) * sizeof *fill);
	for (uint32_t r = 0; r < T; r++)
		for (size_t p = 0; (!sel || sel[r]) && p < np; p++) {
			const tp_served *S = &vs[(size_t)r * np + p];
			for (size_t k = 0; k < S->nparts; k++) {
				const tp_part *t = &S->parts[k];
				if (TP_PART_READS(t->src))
					cs[fill[node[(size_t)r * np + p][t->src]]++] = (cut){t->base, t->outer, t->stride, S->pieces + t->pi, t->np};
			}
		}
	tp_piece *pc = NULL;
	int rc = 0;
	for (uint32_t g = 0; rc == 0 && g < nnodes; g++) {
		cut *gc = cs + cnt[g];
		size_t n = cnt[g + 1] - cnt[g];
		qsort(gc, n, sizeof *gc, cmp_cut);
		acc c = {.page = page};
		for (size_t a = 0, b; rc == 0 && a < n; a = b) { /* the cuts of one source tensor */
			size_t need = gc[a].np;
			for (b = a + 1; b < n && gc[b].base == gc[a].base; b++)
				need += gc[b].np;
			if (need > most) { /* room for the group's pieces */
				tp_piece *q = realloc(pc, need * sizeof *pc);
				if (!q) {
					rc = tp_fail(e, TP_ENOMEM, "out of memory");
					break;
				}
				pc = q;
				most = need;
			}
			rc = union_cuts(&c, gc + a, b - a, pc, e);
		}
		out[g].bytes = c.bytes;
		out[g].pages = c.pages;
	}
	free(pc);
	free(cs);
	free(fill);
	free(cnt);
	return rc;
}

/* Merges out[n - 1] back into its predecessors while it overlaps or touches them in the same
 * source (a range grown backwards). */
static void merge_back(tp_io_range *out, size_t *n)
{
	while (*n > 1 && out[*n - 1].src == out[*n - 2].src && out[*n - 1].lo <= out[*n - 2].hi &&
	       out[*n - 1].hi >= out[*n - 2].lo) {
		if (out[*n - 1].lo < out[*n - 2].lo)
			out[*n - 2].lo = out[*n - 1].lo;
		if (out[*n - 1].hi > out[*n - 2].hi)
			out[*n - 2].hi = out[*n - 1].hi;
		(*n)--;
	}
}

/* Appends page range [lo, hi) of source src (rounded out to pages), merging it into the previous
 * range when they are of the same source and overlap or touch. Returns 0, or -1 when out is full
 * and the range could not be merged. */
static int push(tp_io_range *out, size_t cap, size_t *n, uint32_t src, uint64_t lo, uint64_t hi, uint64_t page)
{
	lo &= ~(page - 1);
	hi = (hi + page - 1) & ~(page - 1);
	if (*n && out[*n - 1].src == src && lo <= out[*n - 1].hi && hi >= out[*n - 1].lo) {
		if (lo < out[*n - 1].lo)
			out[*n - 1].lo = lo;
		if (hi > out[*n - 1].hi)
			out[*n - 1].hi = hi;
		merge_back(out, n);
		return 0;
	}
	if (*n == cap)
		return -1;
	out[*n] = (tp_io_range){lo, hi, src};
	(*n)++;
	return 0;
}

/* Pushes the source ranges of cut bytes [x, c1) of a cut whose byte y lies at source offset
 * at + y / rep * stride + y % rep (rows of rep bytes, stride apart): one range where no whole page
 * lies between two rows, else a range per row. Returns the cut byte reached: c1, or less where out
 * filled up. */
static uint64_t push_rows(tp_io_range *out, size_t cap, size_t *n, uint32_t src, uint64_t at, uint64_t stride,
			  uint64_t rep, uint64_t x, uint64_t c1, uint64_t page)
{
	if (x >= c1)
		return c1;
	if (stride <= rep || stride - rep < page || x / rep == (c1 - 1) / rep)
		return push(out, cap, n, src, at + x / rep * stride + x % rep,
			    at + (c1 - 1) / rep * stride + (c1 - 1) % rep + 1, page) < 0
			       ? x
			       : c1;
	while (x < c1) {
		uint64_t q = x / rep, e = (q + 1) * rep < c1 ? (q + 1) * rep : c1;
		if (push(out, cap, n, src, at + q * stride + x % rep, at + q * stride + (e - 1) % rep + 1, page) < 0)
			return x;
		x = e;
	}
	return c1;
}

/* tp_io_ranges and tp_io_ranges_src: with by_src, each range of its runs' source. */
static size_t ranges(const tp_run *runs, size_t nr, uint64_t page, tp_io_range *out, size_t cap, tp_io_at *at,
		     int by_src)
{
	size_t n = 0;
	for (; at->run < nr; at->run++, at->cut = 0) {
		const tp_run *r = &runs[at->run];
		uint32_t src = by_src ? r->src : 0;
		if (r->kind == TP_RUN_TRANSPOSE) { /* the rows of its cut span (tp_run_t_src), not what lies between */
			uint64_t lo, hi;
			tp_run_t_span(r, &lo, &hi);
			uint64_t to = push_rows(out, cap, &n, src, r->off, r->stride, r->rep, lo + at->cut, hi, page);
			if (to < hi) {
				at->cut = to - lo;
				break; /* out is full */
			}
			continue;
		}
		uint64_t a, b;
		tp_run_src_span(r, &a, &b);
		if (a < b && push(out, cap, &n, src, a, b, page) < 0)
			break; /* out is full */
	}
	return n;
}

size_t tp_io_ranges(const tp_run *runs, size_t nr, uint64_t page, tp_io_range *out, size_t cap, tp_io_at *at)
{
	return ranges(runs, nr, page, out, cap, at, 0);
}

size_t tp_io_ranges_src(const tp_run *runs, size_t nr, uint64_t page, tp_io_range *out, size_t cap, tp_io_at *at)
{
	return ranges(runs, nr, page, out, cap, at, 1);
}

/* Piece j of a row, at local offset a of the row (the pieces before it, a bytes): the source
 * offsets within the row, [*x, *y), of its bytes that the row's local bytes [s, e) reach. 0 where
 * it reads none of them (a TP_ZERO piece reads nothing). */
static int piece_part(const tp_piece *pc, uint64_t a, uint64_t s, uint64_t e, uint64_t *x, uint64_t *y)
{
	uint64_t b = a + pc->len;
	if (pc->off == TP_ZERO || !pc->len || b <= s || a >= e)
		return 0;
	*x = pc->off + ((s > a ? s : a) - a);
	*y = pc->off + ((e < b ? e : b) - a);
	return 1;
}

/* The source offsets, within a row, that the row's local bytes [s, e) read: [*lo, *hi) over the
 * pieces (in row order) those bytes reach. 0 where they read nothing. */
static int row_span(const tp_piece *pieces, uint32_t npieces, uint64_t s, uint64_t e, uint64_t *lo, uint64_t *hi)
{
	int any = 0;
	uint64_t a = 0, x, y;
	for (uint32_t j = 0; j < npieces; a += pieces[j].len, j++) {
		if (!piece_part(&pieces[j], a, s, e, &x, &y))
			continue;
		*lo = any && *lo < x ? *lo : x;
		*hi = any && *hi > y ? *hi : y;
		any = 1;
	}
	return any;
}

/* One cut's share of a plan: the pages of local bytes [pos - t0, tend - t0) of a cut whose row o
 * lies at base + o x stride of source src (pieces[0 .. npieces) in row order, rep bytes a row): the
 * whole rows between the first and the last, and of those two only the pieces' bytes reached (a
 * row may be a whole tensor's share: a vocab-parallel embedding's is one row of 131 MB, and a read
 * of its first page fetched all of it, bench/vllm_nodes.py), as one range where the rows' pages
 * run into each other. Returns the rank-file position reached: tend, or less when out filled. */
static uint64_t plan_cut(tp_io_range *out, size_t cap, size_t *n, uint64_t page, uint32_t src, uint64_t base,
			 uint64_t stride, uint64_t rep, const tp_piece *pieces, uint32_t npieces, uint64_t t0, uint64_t pos,
			 uint64_t tend)
{
	uint64_t o0 = (pos - t0) / rep, o1 = (tend - t0 - 1) / rep; /* rows, inclusive */
	tp_piece pc[TP_MAX_PIECES];
	size_t np = 0;
	for (uint32_t j = 0; j < npieces; j++)
		if (pieces[j].off != TP_ZERO && pieces[j].len)
			pc[np++] = pieces[j];
	if (!np)
		return tend;
	qsort(pc, np, sizeof *pc, cmp_piece);
	uint64_t first = pc[0].off, last = 0;
	int dense = 1;
	for (size_t j = 0; j < np; j++) {
		if (j && pc[j].off > last && pc[j].off - last >= page)
			dense = 0;
		if (pc[j].off + pc[j].len > last)
			last = pc[j].off + pc[j].len;
	}
	if (o1 > o0 && stride - last + first >= page)
		dense = 0;
	const uint64_t s0 = pos - t0 - o0 * rep, e1 = tend - t0 - o1 * rep; /* within rows o0 and o1 */
	if (dense) {
		uint64_t lo = first, hi = last, x, y;
		if (row_span(pieces, npieces, s0, o1 == o0 ? e1 : rep, &x, &y))
			lo = x;
		if (row_span(pieces, npieces, o1 == o0 ? s0 : 0, e1, &x, &y))
			hi = y;
		if (o1 == o0 && hi <= lo)
			return tend;
		uint64_t from = base + o0 * stride + lo, to = base + o1 * stride + hi;
		if (o1 > o0 && base + (o0 + 1) * stride + first < from)
			from = base + (o0 + 1) * stride + first; /* (not reached: dense rows run into each other) */
		if (o1 > o0 && base + (o1 - 1) * stride + last > to)
			to = base + (o1 - 1) * stride + last;
		return push(out, cap, n, src, from, to, page) < 0 ? pos : tend;
	}
	for (uint64_t o = o0; o <= o1; o++) {
		if (*n + npieces > cap)
			return pos;
		uint64_t s = o == o0 ? s0 : 0, e = o == o1 ? e1 : rep, a = 0, x, y;
		for (uint32_t j = 0; j < npieces; a += pieces[j].len, j++) /* the pieces' bytes in [s, e) */
			if (piece_part(&pieces[j], a, s, e, &x, &y))
				push(out, cap, n, src, base + o * stride + x, base + o * stride + y, page);
		uint64_t next = t0 + (o + 1) * rep;
		pos = next < tend ? next : tend;
	}
	return tend;
}

size_t tp_io_plan(const tp_layout *L, uint64_t a, uint64_t b, uint64_t page, tp_io_range *out, size_t cap,
		  uint64_t *covered)
{
	size_t n = 0;
	*covered = 0;
	if (b > L->size)
		b = L->size;
	if (a >= b || cap < TP_MAX_PIECES)
		return 0;
	uint64_t pos = a < L->hdr_size ? L->hdr_size : a; /* the header reads no source */
	if (pos >= b) {
		*covered = b - a;
		return 0;
	}
	/* the first local tensor that ends past pos */
	size_t lo = 0, hi = L->n;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (L->hdr_size + L->t[mid].off + L->t[mid].size <= pos)
			lo = mid + 1;
		else
			hi = mid;
	}
	for (size_t i = lo; i < L->n && pos < b; i++) {
		const tp_ltensor *lt = &L->t[i];
		uint64_t t0 = L->hdr_size + lt->off, tend = t0 + lt->size < b ? t0 + lt->size : b;
		if (!lt->size || tend <= pos)
			continue;
		tp_piece pc[TP_MAX_PIECES];
		for (uint32_t j = 0; j < lt->np; j++)
			pc[j] = tp_layout_piece(L, lt->pi + j);
		uint64_t to = plan_cut(out, cap, &n, page, 0, L->h->data_start + L->h->t[lt->src].begin, lt->stride, lt->rep,
				       pc, lt->np, t0, pos, tend);
		if (to < tend) {
			pos = to;
			break; /* out is full */
		}
		pos = tend;
	}
	*covered = (pos < b ? pos : b) - a;
	return n;
}

size_t tp_served_io_plan(const tp_served *S, uint64_t a, uint64_t b, uint64_t page, tp_io_range *out, size_t cap,
			 uint64_t *covered, uint64_t *cut)
{
	size_t n = 0;
	uint64_t skip = *cut; /* of the transposed matrix holding a */
	*covered = 0;
	*cut = 0;
	if (b > S->size)
		b = S->size;
	if (a >= b || cap < TP_MAX_PIECES)
		return 0;
	uint64_t pos = a < S->hdr_size ? S->hdr_size : a; /* the header and the constants read no source */
	if (pos >= b) {
		*covered = b - a;
		return 0;
	}
	/* the first part that ends past pos (parts are never empty) */
	size_t lo = 0, hi = S->nparts;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (S->hdr_size + S->parts[mid].off + S->parts[mid].size <= pos)
			lo = mid + 1;
		else
			hi = mid;
	}
	for (size_t i = lo; i < S->nparts && pos < b; i++) {
		const tp_part *p = &S->parts[i];
		uint64_t t0 = S->hdr_size + p->off, tend = t0 + p->size < b ? t0 + p->size : b;
		if (!TP_PART_READS(p->src)) {
			pos = tend;
			continue;
		}
		if (p->tes) { /* transposed: the cut rows of every matrix the output bytes reach (an output row
			       * reads all its matrix's rows), from `skip` in the one holding a */
			const tp_piece *pc = S->pieces + p->pi;
			uint64_t mat = (uint64_t)p->trows * p->tcols * p->tes, m = (pos - t0) / mat, m1 = (tend - t0 - 1) / mat;
			for (; m <= m1; m++) {
				uint64_t c0 = m * mat, c1 = c0 + mat, holds_a = t0 + c0 <= a && a < t0 + c1;
				if (p->np == 2) { /* two segments: each half's rows of the matrix, [0, hm) then [hm, 2 hm) */
					uint64_t hm = mat / 2, v = holds_a ? skip : 0, to = 0;
					for (uint32_t j = 0; j < 2; j++) {
						uint64_t lo = v > j * hm ? v - j * hm : 0;
						if (lo >= hm)
							continue;
						to = push_rows(out, cap, &n, p->src, p->base + pc[j].off, p->stride, pc[j].len,
							       c0 / 2 + lo, c0 / 2 + hm, page);
						if (to < c0 / 2 + hm) {
							to = j * hm + to - c0 / 2;
							break;
						}
						to = mat;
					}
					if (to < mat) {
						*cut = to;
						break; /* out is full */
					}
					continue;
				}
				uint64_t to = push_rows(out, cap, &n, p->src, p->base + pc->off, p->stride, p->rep,
							c0 + (holds_a ? skip : 0), c1, page);
				if (to < c1) {
					*cut = to - c0;
					break; /* out is full */
				}
			}
			if (m <= m1) {
				pos = t0 + m * mat > pos ? t0 + m * mat : pos;
				break;
			}
			pos = tend;
			continue;
		}
		if (p->dblk) { /* deinterleaved: the cut's rows of every block the output bytes reach */
			uint64_t c0 = (pos - t0) / p->dblk * p->dblk, c1 = (tend - t0 + p->dblk - 1) / p->dblk * p->dblk;
			uint64_t to = plan_cut(out, cap, &n, page, p->src, p->base, p->stride, p->rep, S->pieces + p->pi, p->np,
					       0, c0, c1 < p->size ? c1 : p->size);
			if (to < (c1 < p->size ? c1 : p->size)) {
				if (t0 + to / p->dblk * p->dblk > pos)
					to = to / p->dblk * p->dblk; /* resume at the block: its rows come in any order */
				pos = t0 + to > pos ? t0 + to : pos;
				break; /* out is full */
			}
			pos = tend;
			continue;
		}
		if (p->widen) { /* output byte x is byte x / 2 of the cut: plan the cut's bytes, in whole values */
			uint64_t c0 = (pos - t0) / 4 * 2, c1 = (tend - t0 + 3) / 4 * 2;
			uint64_t to = plan_cut(out, cap, &n, page, p->src, p->base, p->stride, p->rep, S->pieces + p->pi, p->np,
					       0, c0, c1);
			if (to < c1) {
				pos = t0 + 2 * to > pos ? t0 + 2 * to : pos;
				break; /* out is full */
			}
			pos = tend;
			continue;
		}
		uint64_t to = plan_cut(out, cap, &n, page, p->src, p->base, p->stride, p->rep, S->pieces + p->pi, p->np, t0,
				       pos, tend);
		if (to < tend) {
			pos = to;
			break; /* out is full */
		}
		pos = tend;
	}
	*covered = (pos < b ? pos : b) - a;
	return n;
}
