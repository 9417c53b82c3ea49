/* test_served.c: served files made of pieces of several sources (served.h) against a naive reference.
 *
 * An engine view serves tensors made of pieces: each a plan cut of one source tensor, in any source file,
 * concatenated or stacked (over experts, some owned by one rank), widened, transposed, zero off rank 0, or a
 * constant. Random worlds of such tensors over 1 to 3 source files, at T = 1 to 4 on every rank, are built by
 * tp_served_build and read at random offsets through the mapper and the CPU gather; the bytes must equal the
 * naive served tensor (naive.h's naive_tensor per piece, put together here) and the prefetch plans the brute
 * force. A layout is checked as the special case of one source and one piece per tensor; what the rules
 * refuse must be refused, naming the tensor and the rule. test_map.c checks the layouts (one source file). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gather.h"
#include "guard.h"
#include "io_plan.h"
#include "layout.h"
#include "served.h"
#include "naive.h"

/* ---- served files of pieces of several sources (served.h) ---- */

/* One source tensor a random served tensor reads: its case (shape, spec) and where it lies. */
typedef struct mpiece {
	uint32_t file;  /* source file */
	size_t ci;      /* its case in that file's cases */
	int owned;      /* TP_OWNED by unit `unit` of `units` (a routed expert) */
	uint64_t unit, units;
} mpiece;

typedef struct mtensor {
	char name[32];
	uint32_t npieces, nstack; /* nstack 0: not stacked; else nstack groups of npieces */
	mpiece pc[4 * 8];
	int is_const;
	int widen;      /* BF16 / F16 pieces served widened to F32 */
	int transpose;  /* the last two axes swapped */
	int rank0;      /* zeros on ranks other than 0 */
	st_dtype dtype;
	uint32_t ndim;
	uint64_t shape[ST_MAX_DIMS];
	uint8_t cbytes[64];
} mtensor;

enum { MS_FILES = 3, MS_CASES = 4 * 4 * 8 + 8 };

typedef struct mworld {
	uint32_t nfiles;
	tcase cases[MS_FILES][MS_CASES];
	char names[MS_FILES][MS_CASES][24];
	size_t ncases[MS_FILES];
	file f[MS_FILES];
	mtensor t[6];
	size_t nt;
} mworld;

/* A random split of an axis of `len` = units x unit (one or two segments, even or uneven,
 * sometimes padded; with `even`, units of an even width). */
static tp_spec random_spec(uint32_t axis, uint64_t *len, int even)
{
	uint64_t unit = (1 + rnd() % 3) * (even ? 2 : 1), u0 = rnd() % 2 ? 12 : 1 + rnd() % 8;
	tp_spec s = split(axis, u0, unit, rnd() % 4 ? TP_UNEVEN : 0);
	if (rnd() % 4 == 0) {
		s.nseg = 2;
		s.seg[1] = rnd() % 2 ? 12 : 1 + rnd() % 6;
	} else if (rnd() % 6 == 0) {
		s.pad_to = 4;
	}
	*len = 0;
	for (uint32_t g = 0; g < s.nseg; g++)
		*len += s.seg[g] * unit;
	return s;
}

/* Adds a source tensor of shape (first, rest...) cut by spec to a random file. */
static mpiece add_source(mworld *w, st_dtype dt, uint32_t ndim, uint64_t first, const uint64_t *rest, tp_spec spec)
{
	mpiece p = {.file = (uint32_t)(rnd() % w->nfiles)};
	p.ci = w->ncases[p.file]++;
	assert_true(p.ci < MS_CASES);
	char *nm = w->names[p.file][p.ci];
	snprintf(nm, sizeof w->names[0][0], "src%u.t%zu", p.file, p.ci);
	tcase *c = &w->cases[p.file][p.ci];
	*c = (tcase){nm, dt, ndim, {0}, spec};
	c->shape[0] = first;
	for (uint32_t a = 1; a < ndim; a++)
		c->shape[a] = rest[a];
	return p;
}

/* A random world: 1 to 3 source files, 1 to 4 served tensors of 1 to 4 pieces each (concatenated
 * on axis 0: each piece split on axis 0 its own way or whole; or all split alike on axis 1; or
 * scalars, several of which make a vector),
 * some stacked over 1 to 8 experts (sometimes owned, expert parallelism), and one or two
 * constants. */
static void random_world(mworld *w)
{
	static const st_dtype dts[] = {ST_F32, ST_BF16, ST_F16, ST_U8, ST_I64, ST_F4};
	memset(w, 0, sizeof *w);
	w->nfiles = 1 + (uint32_t)(rnd() % MS_FILES);
	size_t ns = 1 + rnd() % 4;
	for (size_t i = 0; i < ns; i++) {
		mtensor *t = &w->t[w->nt++];
		snprintf(t->name, sizeof t->name, "served.%zu", i);
		st_dtype dt = dts[rnd() % 6];
		uint32_t ndim = 1 + (uint32_t)(rnd() % 3);
		int cols = ndim >= 2 && rnd() % 3 == 0;
		int f4 = dt == ST_F4; /* every source tensor a whole number of bytes: the last axis even */
		uint64_t rest[ST_MAX_DIMS] = {0};
		for (uint32_t a = 1; a < ndim; a++)
			rest[a] = (1 + rnd() % 6) * (f4 && a + 1 == ndim ? 2 : 1);
		tp_spec colspec = tp_spec_replicate();
		if (cols)
			colspec = random_spec(1, &rest[1], f4 && ndim == 2);
		t->npieces = 1 + (uint32_t)(rnd() % 4);
		t->nstack = rnd() % 2 ? 1 + (uint32_t)(rnd() % 8) : 0;
		int owned = t->nstack && rnd() % 3 == 0;
		int whole = !t->nstack && rnd() % 5 == 0; /* owned whole by unit `u` of 8: absent from other ranks */
		uint64_t u = rnd() % 8;
		if (ndim == 1 && !f4 && rnd() % 4 == 0)
			ndim = 0; /* scalar pieces: alone in a group, or several making a vector */
		/* each piece's axis 0 and spec, the same in every group */
		uint64_t first[4];
		tp_spec spec[4];
		for (uint32_t k = 0; k < t->npieces; k++) {
			if (cols || ndim == 0 || rnd() % 3 == 0) {
				first[k] = ndim ? (1 + rnd() % 7) * (f4 && ndim == 1 ? 2 : 1) : 0;
				spec[k] = cols ? colspec : tp_spec_replicate();
			} else {
				spec[k] = random_spec(0, &first[k], f4 && ndim == 1);
			}
		}
		t->widen = (dt == ST_BF16 || dt == ST_F16) && rnd() % 2;
		t->transpose = !t->widen && t->npieces == 1 && !t->nstack && !whole && ndim >= 2 && !f4 && rnd() % 2;
		if (t->transpose) { /* a cut of whole rows in one piece: whole, or one segment, no padding */
			uint64_t units = 1 + rnd() % 8, unit = 1 + rnd() % 3;
			spec[0] = rnd() % 4 == 0 ? tp_spec_replicate() : split(cols, units, unit, rnd() % 4 ? TP_UNEVEN : 0);
			if (cols)
				rest[1] = units * unit;
			else
				first[0] = units * unit;
		}
		t->rank0 = rnd() % 5 == 0;
		for (uint32_t g = 0; g < (t->nstack ? t->nstack : 1); g++)
			for (uint32_t k = 0; k < t->npieces; k++) {
				mpiece *p = &t->pc[g * t->npieces + k];
				*p = add_source(w, dt, ndim, first[k], rest, owned || whole ? tp_spec_replicate() : spec[k]);
				if (owned || whole) {
					p->owned = 1;
					p->unit = owned ? g : u;
					p->units = owned ? t->nstack : 8;
				}
			}
	}
	for (int k = 0, nc = 1 + (int)(rnd() % 2); k < nc; k++) {
		/* constants: an F32 scalar 1.0, or a small random tensor */
		mtensor *c = &w->t[w->nt++];
		c->is_const = 1;
		snprintf(c->name, sizeof c->name, "attn._%c_scale", "kv"[k]);
		c->dtype = ST_F32;
		if (rnd() % 2) {
			float one = 1.0f;
			memcpy(c->cbytes, &one, 4);
		} else {
			c->dtype = ST_BF16;
			c->ndim = 2;
			c->shape[0] = 1 + rnd() % 4;
			c->shape[1] = 1 + rnd() % 8;
			for (size_t q = 0; q < sizeof c->cbytes; q++)
				c->cbytes[q] = (uint8_t)rnd();
		}
	}
	for (uint32_t k = 0; k < w->nfiles; k++)
		make_file(w->cases[k], w->ncases[k], &w->f[k]);
}

static void free_world(mworld *w)
{
	for (uint32_t k = 0; k < w->nfiles; k++) {
		st_header_free(&w->f[k].h);
		free(w->f[k].bytes);
	}
}

/* The naive local bytes of one piece on rank r (naive_tensor, or the whole tensor where owned
 * and held by r: units distributed evenly, rank r holding [r units/T, (r+1) units/T)). *held is 0
 * for another rank's expert. Returns -1 where the rules forbid the cut. */
static int naive_piece(const mworld *w, const mpiece *p, uint32_t T, uint32_t r, uint64_t *lsh, uint8_t **out,
		       uint64_t *len, int *held)
{
	const tcase *c = &w->cases[p->file][p->ci];
	const file *f = &w->f[p->file];
	const st_tensor *t = st_find(&f->h, c->name);
	*held = 1;
	if (p->owned) {
		if (p->units % T)
			return -1;
		*held = p->unit >= r * (p->units / T) && p->unit < (r + 1) * (p->units / T);
		if (!*held)
			return 0;
	}
	return naive_tensor(c, f->bytes + f->h.data_start + t->begin, T, r, lsh, out, len);
}

/* The naive served tensor i on rank r: its local shape and bytes (concatenated pieces, groups
 * stacked), from the definition. Returns 1 when the tensor is on r, 0 when not, -1 when some
 * piece cannot be cut. */
static long dropped; /* groups naive_served found on other ranks only (expert parallelism) */

/* Replaces *len bytes of BF16 or F16 values at *out by their F32 values: BF16 as the top half
 * of an F32, F16 through the compiler's _Float16 (an independent conversion). */
static void widen_naive(st_dtype dt, uint8_t **out, uint64_t *len)
{
	uint64_t nv = *len / 2;
	uint8_t *w = malloc(nv * 4 + 1);
	for (uint64_t k = 0; k < nv; k++) {
		uint16_t h;
		memcpy(&h, *out + 2 * k, 2);
		float f;
		if (dt == ST_BF16) {
			uint32_t bits = (uint32_t)h << 16;
			memcpy(&f, &bits, 4);
		} else {
			_Float16 x;
			memcpy(&x, &h, 2);
			f = (float)x;
		}
		uint32_t bits;
		memcpy(&bits, &f, 4);
		if (dt == ST_F16 && (h & 0x7c00) == 0x7c00 && (h & 0x3ff)) /* a NaN: its payload, shifted */
			bits = (uint32_t)(h & 0x8000) << 16 | 0x7f800000u | (uint32_t)(h & 0x3ff) << 13;
		memcpy(w + 4 * k, &bits, 4);
	}
	free(*out);
	*out = w;
	*len = nv * 4;
}

static int naive_served(const mworld *w, const mtensor *t, uint32_t T, uint32_t r, uint32_t *ndim, uint64_t *shape,
			uint8_t **out, uint64_t *len)
{
	*out = malloc(1);
	*len = 0;
	if (t->is_const) {
		*ndim = t->ndim;
		memcpy(shape, t->shape, sizeof t->shape);
		uint64_t n = st_dtype_bits(t->dtype) / 8;
		for (uint32_t a = 0; a < t->ndim; a++)
			n *= t->shape[a];
		*out = realloc(*out, n + 1);
		memcpy(*out, t->cbytes, n);
		*len = n;
		return 1;
	}
	uint32_t groups = t->nstack ? t->nstack : 1, held = 0, bad = 0;
	const tcase *c0 = &w->cases[t->pc[0].file][t->pc[0].ci];
	uint32_t nd = c0->ndim == 0 && t->npieces > 1 ? 1 : c0->ndim; /* several scalars: a vector of them */
	uint64_t gshape[ST_MAX_DIMS] = {0};
	for (uint32_t g = 0; g < groups; g++) {
		int mine = 0;
		for (uint32_t k = 0; k < t->npieces; k++) {
			uint64_t lsh[ST_MAX_DIMS], l;
			uint8_t *b = NULL;
			int h;
			if (naive_piece(w, &t->pc[g * t->npieces + k], T, r, lsh, &b, &l, &h) < 0) {
				bad = 1;
				continue;
			}
			if (!h)
				continue;
			mine = 1;
			if (nd != c0->ndim)
				gshape[0] = k + 1;
			else if (k == 0)
				memcpy(gshape, lsh, sizeof gshape);
			else
				gshape[0] += lsh[0];
			*out = realloc(*out, *len + l + 1);
			memcpy(*out + *len, b, l);
			*len += l;
			free(b);
		}
		held += mine;
	}
	if (bad)
		return -1;
	dropped += groups - held;
	if (!held)
		return 0;
	if (t->nstack) {
		*ndim = nd + 1;
		shape[0] = held;
		memcpy(shape + 1, gshape, nd * sizeof *gshape);
	} else {
		*ndim = nd;
		memcpy(shape, gshape, sizeof gshape);
	}
	if (t->widen) /* each 2-byte value as the F32 of the same number (the compiler's conversions) */
		widen_naive(c0->dtype, out, len);
	if (t->transpose) { /* element (.., i, j) moved to (.., j, i) */
		uint64_t es = st_dtype_bits(c0->dtype) / 8, R = shape[*ndim - 2], C = shape[*ndim - 1], mats = 1;
		for (uint32_t a = 0; a + 2 < *ndim; a++)
			mats *= shape[a];
		uint8_t *tr = malloc(*len + 1);
		for (uint64_t m = 0; m < mats; m++)
			for (uint64_t i = 0; i < R; i++)
				for (uint64_t j = 0; j < C; j++)
					memcpy(tr + ((m * C + j) * R + i) * es, *out + ((m * R + i) * C + j) * es, es);
		free(*out);
		*out = tr;
		shape[*ndim - 2] = C;
		shape[*ndim - 1] = R;
	}
	if (t->rank0 && r != 0)
		memset(*out, 0, *len);
	return 1;
}

/* The descriptions of w's served tensors for tp_served_build (pd: room for their pieces). */
static void describe(const mworld *w, tp_sdesc *d, tp_pdesc *pd)
{
	size_t q = 0;
	for (size_t i = 0; i < w->nt; i++) {
		const mtensor *t = &w->t[i];
		d[i] = (tp_sdesc){.name = t->name};
		if (t->is_const) {
			d[i].cbytes = t->cbytes;
			d[i].dtype = t->dtype;
			d[i].ndim = t->ndim;
			memcpy(d[i].shape, t->shape, sizeof t->shape);
			continue;
		}
		d[i].pieces = pd + q;
		d[i].npieces = t->npieces;
		d[i].nstack = t->nstack;
		d[i].to_f32 = t->widen;
		d[i].transpose = t->transpose;
		d[i].rank0_only = t->rank0;
		for (uint32_t k = 0; k < (t->nstack ? t->nstack : 1) * t->npieces; k++) {
			const mpiece *p = &t->pc[k];
			const tcase *c = &w->cases[p->file][p->ci];
			pd[q].file = p->file;
			pd[q].tensor = (uint32_t)(st_find(&w->f[p->file].h, c->name) - w->f[p->file].h.t);
			pd[q].spec = p->owned ? tp_spec_owned(p->units, p->unit) : c->spec;
			pd[q].deint = 0;
			q++;
		}
	}
}

/* Marks in pages[src][p] the pages (of `page` bytes) of the source runs of bytes [a, b) of S. */
static void served_pages(const tp_served *S, uint64_t a, uint64_t b, uint64_t page, uint8_t **pages)
{
	tp_run runs[16];
	while (a < b) {
		uint64_t cov;
		size_t n = tp_served_map(S, a, b - a, runs, 16, &cov);
		for (size_t k = 0; k < n; k++) {
			const tp_run *r = &runs[k];
			if (r->kind == TP_RUN_TRANSPOSE) { /* every row of each matrix an output element lies in */
				uint64_t mat = (uint64_t)r->rows * r->cols * r->from, m0 = r->pos / mat, m1 = (r->pos + r->len - 1) / mat;
				for (uint64_t x = m0 * mat; x < (m1 + 1) * mat; x++)
					pages[r->src][(r->off + x / r->rep * r->stride + x % r->rep) / page] = 1;
			} else if (r->kind == TP_RUN_SRC || r->kind == TP_RUN_WIDEN) {
				uint64_t bytes = r->kind == TP_RUN_SRC ? r->len : (r->skip + r->len + 3) / 4 * 2;
				for (uint64_t p = r->off / page; p <= (r->off + bytes - 1) / page; p++)
					pages[r->src][p] = 1;
			}
		}
		if (!cov)
			break;
		a += cov;
	}
}

/* The prefetch plans of a served file (tp_served_io_plan) against brute force, for random
 * ranges: each range lies in pages of its own source that the file reads somewhere, and every
 * page the runs of [a, b) read is in a range of that source; tp_io_ranges_src gives exactly the
 * pages of the runs, source by source. Returns the ranges checked. */
static long check_served_io(const tp_served *S, const file *f, uint32_t nf)
{
	long checked = 0;
	uint64_t page = (uint64_t)64 << (rnd() % 4);
	uint8_t *all[MS_FILES], *want[MS_FILES], *got[MS_FILES];
	for (uint32_t k = 0; k < nf; k++) {
		all[k] = calloc(f[k].size / page + 2, 1);
		want[k] = calloc(f[k].size / page + 2, 1);
		got[k] = calloc(f[k].size / page + 2, 1);
	}
	served_pages(S, 0, S->size, page, all);
	for (int trial = 0; trial < 8; trial++) {
		uint64_t a = rnd() % (S->size + 1), b = a + rnd() % (S->size - a + 1);
		for (uint32_t k = 0; k < nf; k++) {
			memset(want[k], 0, f[k].size / page + 2);
			memset(got[k], 0, f[k].size / page + 2);
		}
		served_pages(S, a, b, page, want);
		for (int which = 0; which < 2; which++) {
			tp_io_range out[40];
			if (which == 0) {
				uint64_t x = a, cut = 0;
				while (x < b) {
					uint64_t cov, was = cut;
					size_t n = tp_served_io_plan(S, x, b, page, out, 32 + rnd() % 9, &cov, &cut);
					assert_true(cov > 0 || cut > was); /* progress */
					assert_true(x + cov < b || !cut);
					for (size_t j = 0; j < n; j++) {
						assert_true(out[j].src < nf);
						assert_true(out[j].lo < out[j].hi && out[j].lo % page == 0 && out[j].hi % page == 0);
						for (uint64_t p = out[j].lo / page; p < out[j].hi / page; p++) {
							if (!all[out[j].src][p])
								fail_msg("plan range [%llu, %llu) of source %u holds page %llu the file never reads",
									 (unsigned long long)out[j].lo, (unsigned long long)out[j].hi, out[j].src,
									 (unsigned long long)p);
							got[out[j].src][p] = 1;
						}
					}
					x += cov;
				}
			} else {
				tp_run runs[64];
				uint64_t x = a;
				while (x < b) {
					uint64_t cov;
					size_t nr = tp_served_map(S, x, b - x, runs, 64, &cov);
					tp_io_at at = {0, 0};
					while (at.run < nr) {
						tp_io_at was = at;
						size_t n = tp_io_ranges_src(runs, nr, page, out, 1 + rnd() % 8, &at);
						assert_true(at.run > was.run || (at.run == was.run && at.cut > was.cut)); /* progress */
						for (size_t j = 0; j < n; j++) {
							if (j)
								assert_false(out[j].src == out[j - 1].src && out[j].lo <= out[j - 1].hi &&
									     out[j].hi >= out[j - 1].lo); /* merged */
							for (uint64_t p = out[j].lo / page; p < out[j].hi / page; p++) {
								if (!want[out[j].src][p])
									fail_msg("range of source %u holds page %llu that no run of it touches",
										 out[j].src, (unsigned long long)p);
								got[out[j].src][p] = 1;
							}
						}
					}
					x += cov;
				}
			}
			for (uint32_t k = 0; k < nf; k++)
				for (uint64_t p = 0; p < f[k].size / page + 1; p++)
					if (want[k][p] && !got[k][p])
						fail_msg("%s: page %llu of source %u, read by [%llu, %llu), is in no range",
							 which ? "tp_io_ranges_src" : "tp_served_io_plan", (unsigned long long)p, k,
							 (unsigned long long)a, (unsigned long long)b);
			for (uint32_t k = 0; k < nf; k++)
				memset(got[k], 0, f[k].size / page + 2);
			checked++;
		}
	}
	for (uint32_t k = 0; k < nf; k++) {
		free(all[k]);
		free(want[k]);
		free(got[k]);
	}
	return checked;
}

/* Served files of random tensors made of pieces of 1 to 3 source files, at T = 1 to 4 on every
 * rank: the header parses back with the naive shapes in the writer's order, and thousands of
 * random reads (any offset and length, across header and tensor boundaries, with run buffers of
 * 1 to 16 runs so that the mapper must resume) through tp_served_map and the CPU gather over the
 * table of sources equal a rank file built in memory from the definition. Where the rules forbid
 * a piece's cut the build must refuse. The prefetch plans of each file are checked too
 * (check_served_io). */
static void test_multi_source_random(void **state)
{
	(void)state;
	long reads = 0, refusals = 0, files = 0, multi = 0, stacked = 0, empty = 0, planned = 0, widened = 0;
	long transposed = 0, zeroed = 0;
	dropped = 0;
	mworld *w = malloc(sizeof *w);
	for (int trial = 0; trial < 150; trial++) {
		random_world(w);
		tp_sdesc d[6];
		tp_pdesc pd[6 * 32];
		describe(w, d, pd);
		const st_header *hs[MS_FILES];
		tp_src srcs[MS_FILES];
		for (uint32_t k = 0; k < w->nfiles; k++) {
			hs[k] = &w->f[k].h;
			srcs[k] = (tp_src){.fd = -1, .map = w->f[k].bytes, .size = w->f[k].size};
		}
		st_meta meta[1] = {{"format", "pt"}};
		for (uint32_t T = 1; T <= 4; T++) {
			for (uint32_t r = 0; r < T; r++) {
				/* the reference, from the definition */
				uint8_t *tb[6];
				uint64_t tl[6], tsh[6][ST_MAX_DIMS] = {{0}};
				uint32_t tnd[6];
				int on[6], refuse = 0;
				size_t non = 0;
				for (size_t i = 0; i < w->nt; i++) {
					on[i] = naive_served(w, &w->t[i], T, r, &tnd[i], tsh[i], &tb[i], &tl[i]);
					refuse |= on[i] < 0;
					non += on[i] > 0;
				}
				tp_served S;
				tp_err e;
				int rc = tp_served_build(hs, w->nfiles, d, w->nt, meta, 1, NULL, 0, T, r, "rank.safetensors", &S, &e);
				if (refuse) {
					if (rc == 0)
						fail_msg("trial %d T=%u r=%u: the rules forbid a cut but the file was built", trial, T, r);
					refusals++;
					for (size_t i = 0; i < w->nt; i++)
						free(tb[i]);
					continue;
				}
				if (rc < 0)
					fail_msg("trial %d T=%u r=%u: refused: %s", trial, T, r, e.msg);
				assert_int_equal(S.nsrc, w->nfiles);
				/* the header parses back: the tensors on this rank, naive shapes, writer order */
				uint8_t *img = calloc(S.size + 1, 1), *local = malloc(S.local_size + 1);
				tp_served_local(&S, local);
				memcpy(img, local, S.hdr_size);
				uint64_t jl = 0;
				for (int b = 7; b >= 0; b--)
					jl = jl << 8 | img[b];
				assert_int_equal(jl + 8, S.hdr_size);
				st_header lh;
				if (st_parse_header((char *)img + 8, jl, S.size, "rank", &lh, &e) < 0)
					fail_msg("trial %d T=%u r=%u: header refused: %s", trial, T, r, e.msg);
				assert_int_equal(lh.n, non);
				for (size_t i = 0; i < w->nt; i++) {
					const st_tensor *lt = st_find(&lh, w->t[i].name);
					if (on[i] == 0) {
						assert_null(lt);
						empty++;
						free(tb[i]);
						continue;
					}
					assert_non_null(lt);
					assert_int_equal(lt->ndim, tnd[i]);
					for (uint32_t a = 0; a < tnd[i]; a++)
						if (lt->shape[a] != tsh[i][a])
							fail_msg("trial %d T=%u r=%u %s: dim %u is %llu, want %llu", trial, T, r, lt->name, a,
								 (unsigned long long)lt->shape[a], (unsigned long long)tsh[i][a]);
					assert_int_equal(lt->end - lt->begin, tl[i]);
					if (w->t[i].widen) {
						assert_int_equal(lt->dtype, ST_F32);
						widened++;
					}
					transposed += w->t[i].transpose;
					zeroed += w->t[i].rank0 && r != 0;
					memcpy(img + lh.data_start + lt->begin, tb[i], tl[i]);
					free(tb[i]);
					stacked += w->t[i].nstack > 1;
				}
				for (size_t i = 1; i < lh.n; i++) /* lh.t is in data order */
					assert_true(st_writer_cmp(lh.t[i - 1].dtype, lh.t[i - 1].name, lh.t[i].dtype, lh.t[i].name) < 0);
				assert_int_equal(lh.data_start + lh.data_len, S.size);
				st_header_free(&lh);

				/* random reads through the mapper and the gather, against the reference */
				uint8_t *buf = malloc(S.size + 64);
				tp_run runs[16];
				int srcs_seen = 0;
				for (int k = 0; k < 60; k++) {
					uint64_t off = k == 0 ? 0 : rnd() % (S.size + 8);
					uint64_t len = k == 0 ? S.size : (k % 3 == 0) ? rnd() % (S.size + 16) : rnd() % 48;
					size_t cap = 1 + rnd() % 16;
					uint64_t want = off < S.size ? (len < S.size - off ? len : S.size - off) : 0, got = 0;
					while (got < want) {
						uint64_t cov;
						size_t nr = tp_served_map(&S, off + got, len - got, runs, cap, &cov);
						assert_true(cov > 0);
						assert_true(nr <= cap);
						assert_int_equal(tp_runs_bytes(runs, nr), cov);
						for (size_t q = 0; q < nr; q++) {
							if (tp_run_reads(&runs[q])) {
								assert_true(runs[q].src < w->nfiles);
								srcs_seen |= 1 << runs[q].src;
							} else {
								assert_int_equal(runs[q].src, 0);
							}
							if (runs[q].kind == TP_RUN_CONST) /* past the header, inside the local bytes */
								assert_true(runs[q].off >= S.hdr_size && runs[q].off + runs[q].len <= S.local_size);
							if (q + 1 < nr) /* merged: no run continues the previous one */
								assert_false(runs[q].kind == runs[q + 1].kind && runs[q].kind != TP_RUN_WIDEN &&
									     runs[q].kind != TP_RUN_TRANSPOSE &&
									     (runs[q].kind == TP_RUN_ZERO ||
									      (runs[q].src == runs[q + 1].src &&
									       runs[q].off + runs[q].len == runs[q + 1].off)));
						}
						if (k % 2 ? tp_gather_cpu(runs, nr, srcs, local, buf + got, &e) < 0
							  : tp_guarded_gather_n(&tp_gather_cpu_backend, runs, nr, srcs, w->nfiles, local,
										buf + got, &e) < 0)
							fail_msg("gather: %s", e.msg);
						got += cov;
					}
					uint64_t cov;
					assert_int_equal(tp_served_map(&S, off + got, len - got, runs, cap, &cov), 0);
					if (memcmp(buf, img + off, want) != 0)
						fail_msg("trial %d T=%u r=%u: read [%llu, +%llu) differs from the reference", trial, T, r,
							 (unsigned long long)off, (unsigned long long)want);
					reads++;
				}
				multi += __builtin_popcount((unsigned)srcs_seen) > 1;
				planned += check_served_io(&S, w->f, w->nfiles);
				files++;
				free(buf);
				free(local);
				free(img);
				tp_served_free(&S);
			}
		}
		free_world(w);
	}
	free(w);
	printf("multi-source: %ld files (%ld reading several sources), %ld reads compared, %ld stacked tensors, "
	       "%ld widened to F32, %ld experts on other ranks, %ld tensors on other ranks only, %ld refusals, "
	       "%ld prefetch plans checked, %ld transposed, %ld zeros off rank 0\n",
	       files, multi, reads, stacked, widened, dropped, empty, refusals, planned, transposed, zeroed);
	assert_true(widened > 50);
	assert_true(transposed > 50);
	assert_true(zeroed > 20);
	assert_true(reads > 20000);
	assert_true(multi > 100);
	assert_true(stacked > 100);
	assert_true(dropped > 100);
	assert_true(empty > 10);
	assert_true(refusals > 10);
}

/* A layout is the special case of a served file: one source, one piece per tensor. Described
 * that way (the same specs, the source's metadata and a rank's own), a served file must have
 * the layout's size, header bytes and, for random ranges and run caps, exactly tp_map's runs. */
static void test_multi_source_layout_case(void **state)
{
	(void)state;
	size_t n;
	tcase *all = all_cases(&n);
	tcase cs[24];
	memcpy(cs, all, n * sizeof *cs);
	char names[4][32];
	for (int x = 0; x < 4; x++) { /* routed experts under expert parallelism, and one absent */
		snprintf(names[x], sizeof names[x], "experts.%d.w1", x);
		cs[n++] = (tcase){names[x], ST_BF16, 2, {4, 6}, x < 3 ? tp_spec_owned(4, (uint64_t)x) : tp_spec_replicate()};
	}
	cs[n - 1].spec.kind = TP_ABSENT;
	file f;
	make_file(cs, n, &f);
	long compared = 0, ranks = 0;
	tp_sdesc *d = calloc(f.h.n, sizeof *d);
	tp_pdesc *pd = calloc(f.h.n, sizeof *pd);
	uint32_t Ts[] = {1, 2, 3, 4, 8};
	for (size_t ti = 0; ti < 5; ti++) {
		uint32_t T = Ts[ti];
		for (uint32_t r = 0; r < T; r++) {
			tp_spec *specs = calloc(f.h.n, sizeof *specs);
			for (size_t i = 0; i < f.h.n; i++) {
				const tcase *c = case_of(cs, n, f.h.t[i].name);
				tp_cut cut;
				specs[i] = c->spec;
				if (c->spec.kind != TP_ABSENT && tp_cut_tensor(&f.h.t[i], &c->spec, T, r, &cut, "", NULL) < 0)
					specs[i] = tp_spec_replicate(); /* unservable here (test_random_reads) */
				pd[i] = (tp_pdesc){.file = 0, .tensor = (uint32_t)i, .spec = specs[i]};
				d[i] = (tp_sdesc){.name = f.h.t[i].name, .pieces = &pd[i], .npieces = 1};
			}
			char rv[16];
			snprintf(rv, sizeof rv, "%u", r);
			st_meta xm[1] = {{"tpfs.tp_rank", rv}};
			tp_layout L;
			tp_served S;
			tp_err e;
			const st_header *hs[1] = {&f.h};
			if (tp_layout_build(&f.h, specs, NULL, T, r, "src.safetensors", &L, &e) < 0)
				fail_msg("T=%u r=%u: layout refused: %s", T, r, e.msg);
			tp_layout_set_meta(&L, xm, r % 2);
			if (tp_served_build(hs, 1, d, f.h.n, f.h.meta, f.h.nmeta, xm, r % 2, T, r, "src.safetensors", &S, &e) < 0)
				fail_msg("T=%u r=%u: served file refused: %s", T, r, e.msg);
			assert_int_equal(S.size, L.size);
			assert_int_equal(S.hdr_size, L.hdr_size);
			assert_int_equal(S.local_size, S.hdr_size);
			assert_int_equal(S.n, L.n);
			char *ha = malloc(L.hdr_size), *hb = malloc(S.hdr_size);
			tp_layout_header(&L, ha);
			tp_served_header(&S, hb);
			assert_memory_equal(ha, hb, L.hdr_size);
			free(ha);
			free(hb);
			for (int k = 0; k < 300; k++) {
				uint64_t off = rnd() % (L.size + 8), len = k % 3 ? rnd() % 300 : rnd() % (L.size + 8);
				size_t cap = 1 + rnd() % 12;
				tp_run ra[12], rb[12];
				uint64_t ca, cb;
				size_t na = tp_map(&L, off, len, ra, cap, &ca), nb = tp_served_map(&S, off, len, rb, cap, &cb);
				assert_int_equal(na, nb);
				assert_int_equal(ca, cb);
				for (size_t q = 0; q < na; q++) {
					assert_int_equal(ra[q].kind, rb[q].kind);
					assert_int_equal(ra[q].off, rb[q].off);
					assert_int_equal(ra[q].len, rb[q].len);
					assert_int_equal(ra[q].src, 0);
					assert_int_equal(rb[q].src, 0);
				}
				compared++;
			}
			ranks++;
			tp_served_free(&S);
			tp_layout_free(&L);
			free(specs);
		}
	}
	printf("layout case: %ld ranks, %ld ranges mapped alike\n", ranks, compared);
	free(d);
	free(pd);
	st_header_free(&f.h);
	free(f.bytes);
}

/* What tp_served_build refuses, by its rules: pieces that disagree in dtype or in a dimension
 * other than the first, a concatenated scalar, stacked groups of different shapes, a group only
 * partly on the rank, a piece naming no tensor, two tensors of one name, a constant of no whole
 * bytes. */
/* Transposed parts of matrices larger than the CPU gather's tile (more source rows than its 64, more
 * columns than a 512-byte segment holds), for elements of 1, 2, 4 and 8 bytes, cut by columns on the last
 * axis (the column cut of gpt-oss's gate_up_proj) at T=2: random reads, most starting and ending inside
 * an output row and some inside an element, through the mapper and the CPU gather, equal the naive
 * transpose of the naive cut; rank 1 of a rank0_only copy reads zeros; the prefetch plans of rank 0's file
 * (check_served_io) hold its columns' pages and no page of rank 1's columns between them. */
static void test_transpose_large(void **state)
{
	(void)state;
	const st_dtype dts[4] = {ST_U8, ST_BF16, ST_F32, ST_I64};
	long reads = 0;
	for (int k = 0; k < 4; k++) {
		uint64_t R = 150 + 7 * (uint64_t)k, C2 = 2 * (600 + 31 * (uint64_t)k); /* source [3, R, C2], cut to C2 / 2 */
		tcase cs[1] = {{"w", dts[k], 3, {3, R, C2}, tp_spec_split(2, C2, 1)}};
		file f;
		make_file(cs, 1, &f);
		const st_header *hs[1] = {&f.h};
		tp_src src = {.fd = -1, .map = f.bytes, .size = f.size};
		uint64_t es = st_dtype_bits(dts[k]) / 8, C = C2 / 2, lsh[ST_MAX_DIMS], nl;
		for (int zero = 0; zero < 2; zero++) {
			uint32_t r = zero ? 1 : 0;
			uint8_t *cut = NULL;
			assert_int_equal(naive_tensor(&cs[0], f.bytes + f.h.data_start + f.h.t[0].begin, 2, r, lsh, &cut, &nl), 0);
			assert_int_equal(nl, 3 * R * C * es);
			uint8_t *want = calloc(nl, 1);
			for (uint64_t m = 0; m < 3 && !zero; m++)
				for (uint64_t i = 0; i < R; i++)
					for (uint64_t j = 0; j < C; j++)
						memcpy(want + ((m * C + j) * R + i) * es, cut + ((m * R + i) * C + j) * es, es);
			tp_pdesc pd = {0, 0, cs[0].spec, 0};
			tp_sdesc d = {.name = "wT", .pieces = &pd, .npieces = 1, .transpose = 1, .rank0_only = zero};
			tp_served S;
			tp_err e;
			if (tp_served_build(hs, 1, &d, 1, NULL, 0, NULL, 0, 2, r, "rank.safetensors", &S, &e) < 0)
				fail_msg("%s", e.msg);
			assert_int_equal(S.t[0].shape[1], C);
			assert_int_equal(S.t[0].shape[2], R);
			uint8_t *local = malloc(S.local_size), *buf = malloc(nl + 1);
			tp_served_local(&S, local);
			for (int q = 0; q < 40; q++) {
				uint64_t a = q == 0 ? 0 : rnd() % nl, len = q == 0 ? nl : 1 + rnd() % (nl - a), got = 0;
				while (got < len) {
					tp_run runs[8];
					uint64_t cov;
					size_t nr = tp_served_map(&S, S.hdr_size + a + got, len - got, runs, 8, &cov);
					assert_true(cov > 0);
					if (tp_gather_cpu(runs, nr, &src, local, buf + got, &e) < 0)
						fail_msg("%s", e.msg);
					got += cov;
				}
				if (memcmp(buf, want + a, len))
					fail_msg("%s%s: read [%llu, +%llu) differs from the naive transpose", st_dtype_name(dts[k]),
						 zero ? " (rank 1 of a rank0_only tensor)" : "", (unsigned long long)a,
						 (unsigned long long)len);
				reads++;
			}
			if (!zero) /* the prefetch plans: the rank's columns, not the other rank's between them */
				assert_true(check_served_io(&S, &f, 1) > 0);
			free(local);
			free(buf);
			free(want);
			free(cut);
			tp_served_free(&S);
		}
		st_header_free(&f.h);
		free(f.bytes);
	}
	printf("large transposes: %ld reads compared\n", reads);
}

static void test_multi_source_refusals(void **state)
{
	(void)state;
	tcase cs[] = {
		{"a", ST_BF16, 2, {4, 6}, {0}}, {"b", ST_BF16, 2, {2, 6}, {0}}, {"c", ST_F32, 2, {2, 6}, {0}},
		{"d", ST_BF16, 2, {2, 5}, {0}}, {"s", ST_BF16, 0, {0}, {0}},
	};
	file f;
	make_file(cs, 5, &f);
	const st_header *hs[1] = {&f.h};
	tp_spec rep = tp_spec_replicate();
	uint32_t ia = 0, ib = 0, ic = 0, id = 0, is = 0; /* indexes in file order */
	for (uint32_t i = 0; i < f.h.n; i++) {
		const char *nm = f.h.t[i].name;
		*(nm[0] == 'a' ? &ia : nm[0] == 'b' ? &ib : nm[0] == 'c' ? &ic : nm[0] == 'd' ? &id : &is) = i;
	}
	struct {
		tp_pdesc p[4];
		uint32_t np, nstack;
		const char *why;
	} bad[] = {
		{{{0, ia, rep, 0}, {0, ic, rep, 0}}, 2, 0, "piece 1 is F32, the tensor BF16"},
		{{{0, ia, rep, 0}, {0, id, rep, 0}}, 2, 0, "piece 1 is 5 along axis 1 where the first piece is 6"},
		{{{0, ia, rep, 0}, {0, is, rep, 0}}, 2, 0, "concatenated along the first axis"},
		{{{0, ia, rep, 0}, {0, ib, rep, 0}}, 1, 2, "group 1's local shape differs from group 0's"},
		{{{0, ia, tp_spec_owned(2, 0), 0}, {0, ib, tp_spec_owned(2, 1), 0}}, 2, 0, "group 0 is only partly on rank 0"},
		{{{0, 99, rep, 0}}, 1, 0, "names tensor 99 of source 0, which does not exist"},
		{{{1, ia, rep, 0}}, 1, 0, "names tensor 0 of source 1, which does not exist"},
		{{{0, ia, tp_spec_split(1, 4, 1), 0}}, 1, 0, "tensor 'x': piece 0 (source 0, tensor 'a')"},
	};
	for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
		tp_sdesc d = {.name = "x", .pieces = bad[k].p, .npieces = bad[k].np, .nstack = bad[k].nstack};
		tp_served S;
		tp_err e;
		assert_int_equal(tp_served_build(hs, 1, &d, 1, NULL, 0, NULL, 0, 2, 0, "rank.safetensors", &S, &e), -1);
		if (!strstr(e.msg, bad[k].why))
			fail_msg("case %zu: '%s' does not say '%s'", k, e.msg, bad[k].why);
		assert_non_null(strstr(e.msg, "rank.safetensors: tensor 'x'"));
	}
	tp_pdesc one = {0, ia, rep, 0};
	float v = 1.0f;
	tp_sdesc two[2] = {{.name = "x", .pieces = &one, .npieces = 1}, {.name = "x", .cbytes = (uint8_t *)&v, .dtype = ST_F32}};
	tp_served S;
	tp_err e;
	assert_int_equal(tp_served_build(hs, 1, two, 2, NULL, 0, NULL, 0, 2, 0, "rank.safetensors", &S, &e), -1);
	assert_non_null(strstr(e.msg, "two tensors are named 'x'"));
	tp_sdesc f4 = {.name = "q", .cbytes = (uint8_t *)&v, .dtype = ST_F4, .ndim = 1, .shape = {3}};
	assert_int_equal(tp_served_build(hs, 1, &f4, 1, NULL, 0, NULL, 0, 2, 0, "rank.safetensors", &S, &e), -1);
	assert_non_null(strstr(e.msg, "no whole number of bytes"));
	/* and the valid ones: a [2, 6, 6] stack of cat(a, b), a scalar constant */
	tp_pdesc st[4] = {{0, ia, rep, 0}, {0, ib, rep, 0}, {0, ia, rep, 0}, {0, ib, rep, 0}};
	tp_sdesc ok[2] = {{.name = "w13", .pieces = st, .npieces = 2, .nstack = 2},
			  {.name = "k_scale", .cbytes = (uint8_t *)&v, .dtype = ST_F32}};
	assert_int_equal(tp_served_build(hs, 1, ok, 2, NULL, 0, NULL, 0, 2, 1, "rank.safetensors", &S, &e), 0);
	assert_int_equal(S.n, 2);
	assert_string_equal(S.t[1].name, "w13"); /* the writer's order: F32 before BF16 */
	assert_int_equal(S.t[1].ndim, 3);
	assert_int_equal(S.t[1].shape[0], 2);
	assert_int_equal(S.t[1].shape[1], 6);
	assert_int_equal(S.t[1].shape[2], 6);
	assert_int_equal(S.data_size, 4 + 2 * 6 * 6 * 2);
	tp_served_free(&S);
	/* reshaped: a's [4, 6] (rank 1 of 2, cut by rows: [2, 6]) served as [1, 2, -1] = [1, 2, 6], same
	 * bytes; [12] and [3, -1] do not hold rank 1's 12 elements */
	tp_pdesc half = {0, ia, tp_spec_split(0, 4, 1), 0};
	tp_sdesc rs = {.name = "A_log", .pieces = &half, .npieces = 1, .rs_ndim = 3, .rs_shape = {1, 2, -1}};
	assert_int_equal(tp_served_build(hs, 1, &rs, 1, NULL, 0, NULL, 0, 2, 1, "rank.safetensors", &S, &e), 0);
	assert_int_equal(S.t[0].ndim, 3);
	assert_int_equal(S.t[0].shape[0], 1);
	assert_int_equal(S.t[0].shape[1], 2);
	assert_int_equal(S.t[0].shape[2], 6);
	assert_int_equal(S.data_size, 2 * 6 * 2);
	assert_int_equal(S.parts[0].size, 2 * 6 * 2); /* the cut's bytes, as without the shape */
	assert_int_equal(S.parts[0].base, f.h.data_start + f.h.t[ia].begin);
	tp_served_free(&S);
	/* a 0 keeps the tensor's own dimension at its axis: [0, -1] of rank 1's [2, 6] is [2, 6], [0, 0, 0] is
	 * refused (no axis 2 to keep) */
	int64_t keep[3] = {0, -1, 0};
	rs.rs_ndim = 2;
	memcpy(rs.rs_shape, keep, sizeof keep);
	assert_int_equal(tp_served_build(hs, 1, &rs, 1, NULL, 0, NULL, 0, 2, 1, "rank.safetensors", &S, &e), 0);
	assert_int_equal(S.t[0].ndim, 2);
	assert_int_equal(S.t[0].shape[0], 2);
	assert_int_equal(S.t[0].shape[1], 6);
	tp_served_free(&S);
	int64_t wrong[3][3] = {{24, 0, 0}, {5, -1, 0}, {0, 0, 0}};
	for (int k = 0; k < 3; k++) {
		rs.rs_ndim = k == 0 ? 1 : k + 1;
		memcpy(rs.rs_shape, wrong[k], sizeof wrong[k]);
		assert_int_equal(tp_served_build(hs, 1, &rs, 1, NULL, 0, NULL, 0, 2, 1, "rank.safetensors", &S, &e), -1);
		assert_non_null(strstr(e.msg, "tensor 'A_log': its 12 elements on rank 1 do not fit the view's \"reshape\""));
	}
	st_header_free(&f.h);
	free(f.bytes);
}

/* Reads [a, a + len) of served file S (data bytes) through the mapper (at most 8 runs a call) and the CPU
 * gather into buf. */
static void read_served(const tp_served *S, const tp_src *src, const uint8_t *local, uint64_t a, uint64_t len,
			uint8_t *buf)
{
	uint64_t got = 0;
	tp_err e;
	while (got < len) {
		tp_run runs[8];
		uint64_t cov;
		size_t nr = tp_served_map(S, S->hdr_size + a + got, len - got, runs, 8, &cov);
		assert_true(cov > 0);
		if (tp_gather_cpu(runs, nr, src, local, buf + got, &e) < 0)
			fail_msg("%s", e.msg);
		got += cov;
	}
}

/* Deinterleaved pieces (tp_pdesc.deint: vLLM's Llama 4 q / k rows) and transposed cuts of two segments
 * (Llama 4's experts gate_up_proj [E, H, gate | up]), at T=1, 2 and 4 on every rank: random reads equal
 * the naive result (each piece's naive cut, its rows in blocks of N served even rows then odd rows, then
 * concatenated; the naive cut of each half, transposed, the halves one after the other per matrix); the
 * prefetch plans hold the pages of the rank's bytes (check_served_io); a block that does not fill the
 * rank's rows, deint with a transpose, and an odd block are refused. */
static void test_deinterleave_segments(void **state)
{
	(void)state;
	enum { H = 8, KV = 2, HD = 8, D = 24, E = 3, R = 70, I = 40 };
	tcase cs[4] = {
		{"q", ST_BF16, 2, {H * HD, D}, tp_spec_split(0, H, HD)},
		{"k", ST_BF16, 2, {KV * HD, D}, tp_spec_split(0, KV, HD)},
		{"v", ST_BF16, 2, {KV * HD, D}, tp_spec_split(0, KV, HD)},
		{"gu", ST_BF16, 3, {E, R, 2 * I}, tp_spec_split(2, 2 * I, 1)},
	};
	cs[1].spec.flags = cs[2].spec.flags = TP_GROUPS;
	cs[3].spec.nseg = 2; /* [gate | up]: I units each */
	cs[3].spec.seg[0] = cs[3].spec.seg[1] = I;
	file f;
	make_file(cs, 4, &f);
	const st_header *hs[1] = {&f.h};
	tp_src src = {.fd = -1, .map = f.bytes, .size = f.size};
	long reads = 0;
	for (uint32_t T = 1; T <= 4; T *= 2) {
		for (uint32_t r = 0; r < T; r++) {
			/* the naive qkv: each piece cut, q and k deinterleaved by HD rows */
			uint8_t *want = NULL, *cut[4];
			uint64_t nl[4], lsh[4][ST_MAX_DIMS], tot = 0;
			for (int j = 0; j < 4; j++) {
				uint32_t ti = (uint32_t)(st_find(&f.h, cs[j].name) - f.h.t);
				assert_int_equal(naive_tensor(&cs[j], f.bytes + f.h.data_start + f.h.t[ti].begin, T, r, lsh[j],
							      &cut[j], &nl[j]), 0);
				if (j < 3)
					tot += nl[j];
			}
			want = malloc(tot + nl[3]);
			uint64_t w = 0, row = D * 2;
			for (int j = 0; j < 3; j++) {
				for (uint64_t o = 0; o < lsh[j][0]; o++) {
					uint64_t b = o / HD * HD, i = o % HD;
					uint64_t from = j == 2 ? o : b + (i < HD / 2 ? 2 * i : 2 * (i - HD / 2) + 1);
					memcpy(want + w, cut[j] + from * row, row);
					w += row;
				}
			}
			uint64_t C = lsh[3][2], C2 = C / 2; /* the rank's gate | up columns, C2 each */
			uint8_t *gT = want + tot;
			for (uint64_t m = 0; m < E; m++)
				for (uint64_t s = 0; s < 2; s++)
					for (uint64_t c = 0; c < C2; c++)
						for (uint64_t x = 0; x < R; x++)
							memcpy(gT + (((m * 2 + s) * C2 + c) * R + x) * 2,
							       cut[3] + ((m * R + x) * C + s * C2 + c) * 2, 2);
			tp_pdesc pd[4] = {{0, (uint32_t)(st_find(&f.h, "q") - f.h.t), cs[0].spec, HD},
					  {0, (uint32_t)(st_find(&f.h, "k") - f.h.t), cs[1].spec, HD},
					  {0, (uint32_t)(st_find(&f.h, "v") - f.h.t), cs[2].spec, 0},
					  {0, (uint32_t)(st_find(&f.h, "gu") - f.h.t), cs[3].spec, 0}};
			tp_sdesc d[2] = {{.name = "qkv", .pieces = pd, .npieces = 3},
					 {.name = "w13", .pieces = pd + 3, .npieces = 1, .transpose = 1}};
			tp_served S;
			tp_err e;
			if (tp_served_build(hs, 1, d, 2, NULL, 0, NULL, 0, T, r, "rank.safetensors", &S, &e) < 0)
				fail_msg("T=%u r=%u: %s", T, r, e.msg);
			assert_string_equal(S.t[0].name, "qkv");
			assert_int_equal(S.t[0].size, tot);
			assert_int_equal(S.t[1].shape[1], C);
			assert_int_equal(S.t[1].shape[2], R);
			uint8_t *local = malloc(S.local_size), *buf = malloc(S.data_size + 1);
			tp_served_local(&S, local);
			for (int q = 0; q < 60; q++) {
				uint64_t a = q == 0 ? 0 : rnd() % S.data_size, len = q == 0 ? S.data_size : 1 + rnd() % (S.data_size - a);
				read_served(&S, &src, local, a, len, buf);
				if (memcmp(buf, want + a, len))
					fail_msg("T=%u r=%u: read [%llu, +%llu) differs from the naive deinterleave / transpose", T, r,
						 (unsigned long long)a, (unsigned long long)len);
				reads++;
			}
			assert_true(check_served_io(&S, &f, 1) > 0);
			free(local);
			free(buf);
			free(want);
			for (int j = 0; j < 4; j++)
				free(cut[j]);
			tp_served_free(&S);
			/* refused: a block of 3 rows (odd), of 16 (more than a rank's q at T=4... and not dividing its
			 * 8 KV rows), a deinterleaved piece of a transposed tensor */
			tp_pdesc odd = pd[0], big = pd[1], tr = pd[3];
			odd.deint = 3;
			big.deint = 3 * HD;
			tr.deint = 2;
			tp_sdesc bad[3] = {{.name = "a", .pieces = &odd, .npieces = 1}, {.name = "b", .pieces = &big, .npieces = 1},
					   {.name = "c", .pieces = &tr, .npieces = 1, .transpose = 1}};
			for (int k = 0; k < 3; k++) {
				assert_int_equal(tp_served_build(hs, 1, &bad[k], 1, NULL, 0, NULL, 0, T, r, "rank.safetensors", &S, &e),
						 -1);
				if (!strstr(e.msg, "are not whole blocks of"))
					fail_msg("case %d: '%s'", k, e.msg);
			}
		}
	}
	printf("deinterleave and two-segment transposes: %ld reads compared\n", reads);
	st_header_free(&f.h);
	free(f.bytes);
}

int main(void)
{
	/* the generator's state after test_map.c's tests, when they ran first in one program: the worlds drawn
	 * are those these tests were tuned on (test_multi_source_random requires some of each kind) */
	rnd_seed(14161167462641955190ULL);
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_multi_source_random),
		cmocka_unit_test(test_multi_source_layout_case),
		cmocka_unit_test(test_multi_source_refusals),
		cmocka_unit_test(test_transpose_large),
		cmocka_unit_test(test_deinterleave_segments),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
