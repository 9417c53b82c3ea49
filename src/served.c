/* served.c: building served files of pieces, writing their headers and local bytes, and
 * mapping their byte ranges (see served.h). */
#include "served.h"

#include <stdlib.h>
#include <string.h>

#include "map_emit.h"

void tp_served_free(tp_served *S)
{
	free(S->t);
	free(S->parts);
	free(S->pieces);
	free(S->consts);
	memset(S, 0, sizeof *S);
}

/* Growable arrays of the builder. */
static int grow(void **p, size_t *cap, size_t need, size_t elem)
{
	if (need <= *cap)
		return 0;
	size_t c = *cap ? *cap : 16;
	while (c < need)
		c *= 2;
	void *q = realloc(*p, c * elem);
	if (!q)
		return -1;
	*p = q;
	*cap = c;
	return 0;
}

static uint64_t write_header(const tp_served *S, st_wbuf *w)
{
	st_w_begin_x(w, S->meta, S->nmeta, S->xmeta, S->nxmeta);
	for (size_t i = 0; i < S->n; i++) {
		const tp_stensor *t = &S->t[i];
		st_w_tensor(w, t->name, t->dtype, t->ndim, t->shape, t->off, t->off + t->size);
	}
	return st_w_end(w);
}

void tp_served_header(const tp_served *S, char *buf)
{
	st_wbuf w = {.p = buf};
	write_header(S, &w);
}

void tp_served_local(const tp_served *S, uint8_t *buf)
{
	tp_served_header(S, (char *)buf);
	if (S->const_size)
		memcpy(buf + S->hdr_size, S->consts, S->const_size);
}

static int cmp_writer(const void *a, const void *b)
{
	const tp_stensor *x = a, *y = b;
	return st_writer_cmp(x->dtype, x->name, y->dtype, y->name);
}

static int cmp_name(const void *a, const void *b)
{
	return strcmp((*(const tp_stensor *const *)a)->name, (*(const tp_stensor *const *)b)->name);
}

/* The builder's state: S and the capacities of its arrays. */
typedef struct bld {
	tp_served *S;
	size_t tcap, pcap, qcap, ccap;
	const char *fname;
	tp_err *e;
} bld;

/* Cuts piece k of served tensor d (group g) for the rank and appends its part; *absent is set
 * when the piece is not on this rank. Fills shape/ndim/dtype with the piece's local ones. */
static int add_piece(bld *b, const st_header *const *src, const tp_sdesc *d, uint32_t k, int *absent,
		     uint64_t *shape, uint32_t *ndim, st_dtype *dtype)
{
	tp_served *S = b->S;
	const tp_pdesc *p = &d->pieces[k];
	*absent = 0;
	if (p->file >= S->nsrc || p->tensor >= src[p->file]->n)
		return tp_fail(b->e, TP_EPLAN, "%s: tensor '%s': piece %u names tensor %u of source %u, which does not exist (%u sources)",
			       b->fname, d->name, k, p->tensor, p->file, S->nsrc);
	const st_tensor *t = &src[p->file]->t[p->tensor];
	if (p->spec.kind == TP_ABSENT) {
		*absent = 1;
		return 0;
	}
	tp_cut c;
	int ep = S->ep_N && (p->spec.flags & TP_EXPERT);
	uint32_t cT = ep ? S->ep_N : S->T, cr = ep ? S->ep_rank : S->rank;
	if (tp_cut_tensor(t, &p->spec, cT, cr, &c, "", NULL) < 0) {
		/* again with the context for the message (formatted only on failure) */
		char ctx[TP_ERR_MSG];
		tp_fmt(ctx, sizeof ctx, "%s: tensor '%s': piece %u (source %u, tensor '%s')", b->fname, d->name, k, p->file,
		       t->name);
		tp_cut_tensor(t, &p->spec, cT, cr, &c, ctx, b->e);
		return -1;
	}
	if (c.absent) {
		*absent = 1;
		return 0;
	}
	memcpy(shape, c.shape, sizeof c.shape);
	*ndim = c.ndim;
	*dtype = t->dtype;
	if (!c.size)
		return 0; /* no bytes: no part */
	if (grow((void **)&S->parts, &b->pcap, S->nparts + 1, sizeof *S->parts) < 0 ||
	    grow((void **)&S->pieces, &b->qcap, S->npieces + c.np, sizeof *S->pieces) < 0)
		return tp_fail(b->e, TP_ENOMEM, "%s: out of memory building rank %u", b->fname, S->rank);
	S->parts[S->nparts++] = (tp_part){.size = c.size, .base = src[p->file]->data_start + t->begin, .outer = c.outer,
					 .stride = c.stride, .rep = c.rep, .src = p->file,
					 .pi = (uint32_t)S->npieces, .np = c.np};
	if (p->deint) { /* blocks of deint rows, each served even rows first (tp_pdesc.deint) */
		uint64_t rows = c.ndim ? c.shape[0] : 0;
		if (d->to_f32 || d->transpose || d->nstack || !rows || c.size % rows || p->deint % 2 || rows % p->deint)
			return tp_fail(b->e, TP_EPLAN, "%s: tensor '%s': piece %u (source tensor '%s'): rank %u's %llu rows "
				       "are not whole blocks of %llu rows to deinterleave (an even block, on a tensor neither "
				       "widened, transposed nor stacked)", b->fname, d->name, k, t->name, S->rank,
				       (unsigned long long)rows, (unsigned long long)p->deint);
		S->parts[S->nparts - 1].drow = c.size / rows;
		S->parts[S->nparts - 1].dblk = c.size / rows * p->deint;
	}
	memcpy(S->pieces + S->npieces, c.piece, c.np * sizeof *c.piece);
	S->npieces += c.np;
	return 0;
}

/* st's shape as d->rs_shape says (see tp_sdesc: reshaped), its elements unchanged. */
static int reshape(bld *b, const tp_sdesc *d, tp_stensor *st)
{
	uint64_t numel = 1, known = d->rs_ndim <= ST_MAX_DIMS; /* a longer shape is refused below */
	int free_dim = -1;
	for (uint32_t a = 0; a < st->ndim; a++)
		numel *= st->shape[a];
	int64_t want[ST_MAX_DIMS];
	for (uint32_t a = 0; known && a < d->rs_ndim; a++) { /* 0: the tensor's own dimension at that axis */
		want[a] = d->rs_shape[a] == 0 && a < st->ndim ? (int64_t)st->shape[a] : d->rs_shape[a];
		if (want[a] == -1 && free_dim < 0)
			free_dim = (int)a;
		else if (want[a] >= 1 && known <= numel / (uint64_t)want[a])
			known *= (uint64_t)want[a];
		else
			known = 0;
	}
	if (!known || (free_dim < 0 ? known != numel : numel % known))
		return tp_fail(b->e, TP_EPLAN, "%s: tensor '%s': its %llu elements on rank %u do not fit the view's \"reshape\"",
			       b->fname, d->name, (unsigned long long)numel, b->S->rank);
	st->ndim = d->rs_ndim;
	for (uint32_t a = 0; a < d->rs_ndim; a++)
		st->shape[a] = (int)a == free_dim ? numel / known : (uint64_t)want[a];
	return 0;
}

/* st's last two axes swapped (see tp_sdesc: transposed): its one part, if any, made a transposed
 * part. Refuses what a TP_RUN_TRANSPOSE run cannot read: several pieces, a stack, widening, fewer
 * than two axes, a sub-byte dtype, or a cut whose local rows of C elements are not whole in one
 * row of one piece. */
static int transpose(bld *b, const tp_sdesc *d, tp_stensor *st)
{
	tp_served *S = b->S;
	uint64_t bits = st_dtype_bits(st->dtype), R = st->ndim >= 2 ? st->shape[st->ndim - 2] : 0,
		 C = st->ndim >= 2 ? st->shape[st->ndim - 1] : 0;
	if (d->npieces != 1 || d->nstack || d->to_f32 || st->ndim < 2 || bits % 8 || bits > 64)
		return tp_fail(b->e, TP_EPLAN, "%s: tensor '%s': a transposed tensor is one piece of two or more axes and "
			       "whole bytes an element, neither stacked nor widened (here %u pieces, %u axes, %s)",
			       b->fname, d->name, d->npieces, st->ndim, st_dtype_name(st->dtype));
	if (R > UINT32_MAX || C > UINT32_MAX)
		return tp_fail(b->e, TP_ELIMIT, "%s: tensor '%s': a transposed matrix of %llu x %llu is too large",
			       b->fname, d->name, (unsigned long long)R, (unsigned long long)C);
	if (S->nparts > st->part0 && !(d->rank0_only && S->rank != 0)) { /* no part, or zeros: nothing read */
		tp_part *p = &S->parts[st->part0];
		const tp_piece *pc = S->pieces + p->pi;
		uint64_t row = C * (bits / 8);
		int seg2 = p->np == 2 && pc[0].off != TP_ZERO && pc[1].off != TP_ZERO && pc[0].len == pc[1].len &&
			   p->rep == row && pc[1].off > pc[0].off && C % 2 == 0; /* [gate | up] halves of a row */
		if (S->nparts - st->part0 != 1 || (p->np != 1 && !seg2) || pc->off == TP_ZERO ||
		    (!seg2 && pc->len != p->rep) || !row || p->rep % row)
			return tp_fail(b->e, TP_EPLAN, "%s: tensor '%s': rank %u's cut is not whole rows of %llu elements "
				       "in one piece (it cannot be served transposed)", b->fname, d->name, S->rank,
				       (unsigned long long)C);
		p->tes = (uint32_t)(bits / 8);
		p->trows = (uint32_t)R;
		p->tcols = (uint32_t)C;
	}
	st->shape[st->ndim - 2] = C;
	st->shape[st->ndim - 1] = R;
	return 0;
}

/* Appends served tensor d (its parts after S's), or leaves it out when none of its pieces is on
 * this rank. */
static int add_tensor(bld *b, const st_header *const *src, const tp_sdesc *d)
{
	tp_served *S = b->S;
	tp_stensor st = {.name = d->name, .part0 = (uint32_t)S->nparts};
	if (d->cbytes) {
		if (d->npieces || d->ndim > ST_MAX_DIMS || d->dtype >= ST_NDTYPES)
			return tp_fail(b->e, TP_EPLAN, "%s: tensor '%s': a constant has no pieces, a known dtype and at most %d dimensions",
				       b->fname, d->name, ST_MAX_DIMS);
		uint64_t bits = st_dtype_bits(d->dtype);
		for (uint32_t i = 0; i < d->ndim; i++) {
			if (d->shape[i] && bits > UINT64_MAX / 8 / d->shape[i])
				return tp_fail(b->e, TP_ELIMIT, "%s: tensor '%s': the constant is too large", b->fname, d->name);
			bits *= d->shape[i];
		}
		if (bits % 8)
			return tp_fail(b->e, TP_EPLAN, "%s: tensor '%s': the constant's shape holds no whole number of bytes",
				       b->fname, d->name);
		st.dtype = d->dtype;
		st.ndim = d->ndim;
		memcpy(st.shape, d->shape, sizeof st.shape);
		st.size = bits / 8;
		if (st.size) {
			if (grow((void **)&S->parts, &b->pcap, S->nparts + 1, sizeof *S->parts) < 0 ||
			    grow((void **)&S->consts, &b->ccap, S->const_size + st.size, 1) < 0)
				return tp_fail(b->e, TP_ENOMEM, "%s: out of memory building rank %u", b->fname, S->rank);
			S->parts[S->nparts++] = (tp_part){.size = st.size, .base = S->const_size, .src = TP_PART_CONST};
			memcpy(S->consts + S->const_size, d->cbytes, st.size);
			S->const_size += st.size;
		}
	} else {
		if (!d->npieces)
			return tp_fail(b->e, TP_EPLAN, "%s: tensor '%s' has no pieces and no constant", b->fname, d->name);
		uint32_t groups = d->nstack ? d->nstack : 1, present = 0;
		uint64_t gshape[ST_MAX_DIMS] = {0};
		uint32_t gndim = 0;
		for (uint32_t g = 0; g < groups; g++) {
			uint64_t shape[ST_MAX_DIMS] = {0}, ps[ST_MAX_DIMS];
			uint32_t ndim = 0, pn = 0, have = 0, gone = 0;
			st_dtype dt = ST_BOOL;
			for (uint32_t k = g * d->npieces; k < (g + 1) * d->npieces; k++) {
				int absent;
				if (add_piece(b, src, d, k, &absent, ps, &pn, &dt) < 0)
					return -1;
				if (!pn && d->npieces > 1) { /* scalars concatenated: each one element along a new axis */
					pn = 1;
					ps[0] = 1;
				}
				if (absent) {
					gone++;
					continue;
				}
				if (!have++ && !present) {
					st.dtype = dt;
				} else if (dt != st.dtype) {
					return tp_fail(b->e, TP_EPLAN, "%s: tensor '%s': piece %u is %s, the tensor %s", b->fname, d->name,
						       k, st_dtype_name(dt), st_dtype_name(st.dtype));
				}
				if (have == 1) {
					ndim = pn;
					memcpy(shape, ps, sizeof shape);
					continue;
				}
				if (pn != ndim || !pn)
					return tp_fail(b->e, TP_EPLAN, "%s: tensor '%s': piece %u has %u dimensions where the first has %u (pieces are concatenated along the first axis; scalars make a vector)",
						       b->fname, d->name, k, pn, ndim);
				for (uint32_t a = 1; a < ndim; a++)
					if (ps[a] != shape[a])
						return tp_fail(b->e, TP_EPLAN, "%s: tensor '%s': piece %u is %llu along axis %u where the first piece is %llu (pieces are concatenated along the first axis only)",
							       b->fname, d->name, k, (unsigned long long)ps[a], a,
							       (unsigned long long)shape[a]);
				shape[0] += ps[0];
			}
			if (have && gone)
				return tp_fail(b->e, TP_EPLAN, "%s: tensor '%s': group %u is only partly on rank %u (%u of %u pieces)",
					       b->fname, d->name, g, S->rank, have, have + gone);
			if (!have)
				continue;
			if (present++ == 0) {
				gndim = ndim;
				memcpy(gshape, shape, sizeof gshape);
			} else if (ndim != gndim || memcmp(shape, gshape, sizeof shape)) {
				return tp_fail(b->e, TP_EPLAN, "%s: tensor '%s': group %u's local shape differs from group 0's (stacked groups must agree)",
					       b->fname, d->name, g);
			}
		}
		if (!present)
			return 0; /* not on this rank */
		if (d->nstack) {
			if (gndim + 1 > ST_MAX_DIMS)
				return tp_fail(b->e, TP_ELIMIT, "%s: tensor '%s': stacked it would have more than %d dimensions",
					       b->fname, d->name, ST_MAX_DIMS);
			st.ndim = gndim + 1;
			st.shape[0] = present;
			memcpy(st.shape + 1, gshape, gndim * sizeof *gshape);
		} else {
			st.ndim = gndim;
			memcpy(st.shape, gshape, sizeof st.shape);
		}
		if (d->rs_ndim && reshape(b, d, &st) < 0)
			return -1;
		if (d->transpose && transpose(b, d, &st) < 0)
			return -1;
		if (d->to_f32 && st.dtype != ST_F32) { /* F32 pieces are served as they are */
			if (st.dtype != ST_BF16 && st.dtype != ST_F16)
				return tp_fail(b->e, TP_EPLAN, "%s: tensor '%s': its pieces are %s: only BF16 and F16 are widened to F32",
					       b->fname, d->name, st_dtype_name(st.dtype));
			for (size_t q = st.part0; q < S->nparts; q++) {
				S->parts[q].widen = (uint32_t)st.dtype;
				S->parts[q].size *= 2;
			}
			st.dtype = ST_F32;
		}
		for (size_t q = st.part0; q < S->nparts; q++) {
			if (d->rank0_only && S->rank != 0) /* zeros of the same size: nothing read */
				S->parts[q] = (tp_part){.size = S->parts[q].size, .src = TP_PART_ZERO};
			st.size += S->parts[q].size;
		}
	}
	st.nparts = (uint32_t)(S->nparts - st.part0);
	if (grow((void **)&S->t, &b->tcap, S->n + 1, sizeof *S->t) < 0)
		return tp_fail(b->e, TP_ENOMEM, "%s: out of memory building rank %u", b->fname, S->rank);
	S->t[S->n++] = st;
	return 0;
}

/* Puts the tensors in the writer's order, their parts after them in the same order, and gives
 * every tensor and part its data offset. */
static int place(tp_served *S)
{
	qsort(S->t, S->n, sizeof *S->t, cmp_writer);
	tp_part *np = malloc((S->nparts ? S->nparts : 1) * sizeof *np);
	if (!np)
		return -1;
	uint64_t off = 0;
	size_t m = 0;
	for (size_t i = 0; i < S->n; i++) {
		tp_stensor *t = &S->t[i];
		t->off = off;
		for (uint32_t q = 0; q < t->nparts; q++) {
			np[m + q] = S->parts[t->part0 + q];
			np[m + q].off = off;
			off += np[m + q].size;
		}
		t->part0 = (uint32_t)m;
		m += t->nparts;
	}
	free(S->parts);
	S->parts = np;
	S->data_size = off;
	return 0;
}

int tp_served_build(const st_header *const *src, uint32_t nsrc, const tp_sdesc *d, size_t n, const st_meta *meta,
		    size_t nmeta, const st_meta *xmeta, size_t nxmeta, uint32_t T, uint32_t r, const char *fname,
		    tp_served *S, tp_err *e)
{
	return tp_served_build_ep(src, nsrc, d, n, meta, nmeta, xmeta, nxmeta, T, r, 0, 0, fname, S, e);
}

int tp_served_build_ep(const st_header *const *src, uint32_t nsrc, const tp_sdesc *d, size_t n, const st_meta *meta,
		       size_t nmeta, const st_meta *xmeta, size_t nxmeta, uint32_t T, uint32_t r, uint32_t ep_N,
		       uint32_t ep_r, const char *fname, tp_served *S, tp_err *e)
{
	memset(S, 0, sizeof *S);
	S->nsrc = nsrc;
	S->rank = r;
	S->T = T;
	S->ep_N = ep_N;
	S->ep_rank = ep_r;
	S->meta = meta;
	S->nmeta = nmeta;
	S->xmeta = xmeta;
	S->nxmeta = nxmeta;
	bld b = {.S = S, .fname = fname, .e = e};
	for (size_t i = 0; i < n; i++) {
		if (add_tensor(&b, src, &d[i]) < 0) {
			tp_served_free(S);
			return -1;
		}
	}
	/* names are unique */
	const tp_stensor **byname = malloc((S->n ? S->n : 1) * sizeof *byname);
	if (!byname || place(S) < 0) {
		free(byname);
		tp_served_free(S);
		return tp_fail(e, TP_ENOMEM, "%s: out of memory building rank %u", fname, r);
	}
	for (size_t i = 0; i < S->n; i++)
		byname[i] = &S->t[i];
	qsort(byname, S->n, sizeof *byname, cmp_name);
	for (size_t i = 1; i < S->n; i++) {
		if (!strcmp(byname[i]->name, byname[i - 1]->name)) {
			tp_fail(e, TP_EPLAN, "%s: two tensors are named '%s'", fname, byname[i]->name);
			free(byname);
			tp_served_free(S);
			return -1;
		}
	}
	free(byname);
	st_wbuf w = {.p = NULL};
	S->hdr_size = write_header(S, &w);
	if (S->hdr_size - ST_PREFIX > ST_HEADER_MAX) {
		tp_served_free(S);
		return tp_fail(e, TP_ELIMIT, "%s: rank %u's header would exceed %llu bytes", fname, r, ST_HEADER_MAX);
	}
	S->size = S->hdr_size + S->data_size;
	S->local_size = S->hdr_size + S->const_size;
	return 0;
}

/* Index of the part holding data byte x (x < data_size): the last part with off <= x (parts are
 * never empty). */
static size_t find_part(const tp_served *S, uint64_t x)
{
	size_t lo = 0, hi = S->nparts;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (S->parts[mid].off <= x)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo ? lo - 1 : 0;
}

/* Emits output bytes [rel, rel + want) of widened part p: the cut's 2-byte values from value
 * rel / 4 on, mapped in the cut's own bytes (tp_emit_cut, into a small array first: its runs
 * must not merge with the runs before them) and turned into TP_RUN_WIDEN runs of twice their
 * length (zero fill stays zero fill), the first skipping rel % 4 bytes. Returns the output bytes
 * emitted: less than want when out filled. */
static uint64_t emit_widened(const tp_served *S, const tp_part *p, uint64_t rel, uint64_t want, tp_run *out, size_t cap,
			     size_t *n)
{
	uint64_t done = 0, skip = rel % 4, s = rel / 4 * 2; /* s: the position in the cut's bytes */
	while (done < want) {
		tp_run tmp[32];
		size_t nt = 0;
		uint64_t need = (skip + (want - done) + 3) / 4 * 2; /* cut bytes still to cover */
		if (need > p->size / 2 - s)
			need = p->size / 2 - s;
		uint64_t got = tp_emit_cut(tmp, 32, &nt, p->src, p->base, S->pieces + p->pi, NULL, 0, p->np, p->outer,
					   p->stride, p->rep, s, need);
		for (size_t k = 0; k < nt && done < want; k++) {
			uint64_t l = 2 * tmp[k].len - skip;
			if (l > want - done)
				l = want - done;
			if (tmp[k].kind == TP_RUN_ZERO) {
				if (tp_emit(out, cap, n, TP_RUN_ZERO, 0, 0, l) < 0)
					return done;
			} else {
				if (tp_emit(out, cap, n, TP_RUN_WIDEN, p->src, tmp[k].off, l) < 0)
					return done;
				out[*n - 1].skip = (uint8_t)skip;
				out[*n - 1].from = (uint8_t)p->widen;
			}
			done += l;
			skip = 0;
		}
		if (!got)
			break;
		s += got;
	}
	return done;
}

/* Emits output bytes [rel, rel + want) of transposed part p: one TP_RUN_TRANSPOSE run where the cut
 * is one piece. Where it is two (segments, each half of a row: tp_part.tes), output matrix m is
 * the transposes of its two halves [R, C/2], one after the other, each a run of its own over
 * matrices [R, C/2] that start at the half's first byte of matrix m (rows stride apart, C/2
 * elements a row). Returns the bytes emitted: less than want when out filled. */
static uint64_t emit_transposed(const tp_served *S, const tp_part *p, uint64_t rel, uint64_t want, tp_run *out,
				size_t cap, size_t *n)
{
	const tp_piece *pc = S->pieces + p->pi;
	if (p->np == 1) {
		if (*n == cap)
			return 0;
		out[(*n)++] = (tp_run){.kind = TP_RUN_TRANSPOSE, .off = p->base + pc->off, .len = want, .src = p->src,
				       .from = (uint8_t)p->tes, .pos = rel, .stride = p->stride, .rep = p->rep,
				       .rows = p->trows, .cols = p->tcols};
		return want;
	}
	uint64_t half = (uint64_t)p->trows * (p->tcols / 2) * p->tes, done = 0; /* one half's served bytes */
	while (done < want) {
		uint64_t x = rel + done, h = x / half, at = x % half, l = half - at; /* h = 2 m + segment */
		if (l > want - done)
			l = want - done;
		if (*n == cap)
			return done;
		out[(*n)++] = (tp_run){.kind = TP_RUN_TRANSPOSE, .off = p->base + pc[h % 2].off + h / 2 * p->trows * p->stride,
				       .len = l, .src = p->src, .from = (uint8_t)p->tes, .pos = at, .stride = p->stride,
				       .rep = pc[h % 2].len, .rows = p->trows, .cols = p->tcols / 2};
		done += l;
	}
	return done;
}

/* Emits output bytes [rel, rel + want) of deinterleaved part p (tp_part.dblk): each output row's
 * bytes are the cut's row the block's order names, mapped in the cut's own bytes (tp_emit_cut).
 * Returns the bytes emitted: less than want when out filled. */
static uint64_t emit_deint(const tp_served *S, const tp_part *p, uint64_t rel, uint64_t want, tp_run *out, size_t cap,
			   size_t *n)
{
	uint64_t done = 0, N = p->dblk / p->drow;
	while (done < want) {
		uint64_t x = rel + done, row = x / p->drow, in = x % p->drow, j = row % N, l = p->drow - in;
		uint64_t from = row - j + (j < N / 2 ? 2 * j : 2 * (j - N / 2) + 1); /* the cut's row */
		if (l > want - done)
			l = want - done;
		uint64_t got = tp_emit_cut(out, cap, n, p->src, p->base, S->pieces + p->pi, NULL, 0, p->np, p->outer,
					   p->stride, p->rep, from * p->drow + in, l);
		done += got;
		if (got < l)
			break; /* out is full */
	}
	return done;
}

size_t tp_served_map(const tp_served *S, uint64_t off, uint64_t len, tp_run *out, size_t cap, uint64_t *covered)
{
	size_t n = 0;
	*covered = 0;
	if (off >= S->size || !len || !cap)
		return 0;
	if (len > S->size - off)
		len = S->size - off;
	uint64_t done = 0;
	if (off < S->hdr_size) {
		done = S->hdr_size - off < len ? S->hdr_size - off : len;
		tp_emit(out, cap, &n, TP_RUN_HDR, 0, off, done);
	}
	uint64_t x = off + done - S->hdr_size; /* data offset */
	for (size_t i = done < len ? find_part(S, x) : S->nparts; i < S->nparts && done < len; i++) {
		const tp_part *p = &S->parts[i];
		uint64_t rel = x - p->off, want = len - done, l;
		if (want > p->size - rel)
			want = p->size - rel;
		if (p->src == TP_PART_CONST)
			l = tp_emit(out, cap, &n, TP_RUN_CONST, 0, S->hdr_size + p->base + rel, want) < 0 ? 0 : want;
		else if (p->src == TP_PART_ZERO)
			l = tp_emit(out, cap, &n, TP_RUN_ZERO, 0, 0, want) < 0 ? 0 : want;
		else if (p->tes)
			l = emit_transposed(S, p, rel, want, out, cap, &n);
		else if (p->dblk)
			l = emit_deint(S, p, rel, want, out, cap, &n);
		else if (p->widen)
			l = emit_widened(S, p, rel, want, out, cap, &n);
		else
			l = tp_emit_cut(out, cap, &n, p->src, p->base, S->pieces + p->pi, NULL, 0, p->np, p->outer, p->stride,
					p->rep, rel, want);
		done += l;
		x += l;
		if (l < want)
			break; /* out is full */
	}
	*covered = done;
	return n;
}
