/* test_map.c: the range mapper and the CPU gather against a naive reference.
 *
 * The reference materializes every rank file in the simplest way: for each local element, find
 * the source element by mapping the split axis index through an index list computed from the
 * distribution rules (written here again, independently of spec.c), and copy its bits. The
 * local header is checked by parsing it back. Then thousands of random (offset, length) reads
 * through tp_map + tp_gather_cpu, with small run buffers to force resumption, must equal the
 * materialized bytes. T in {1, 2, 3, 4, 8}; column, row and middle-axis splits; segments;
 * even, uneven, replicated-group and padded distributions; scalar, empty, 3-D, sub-byte and
 * block-scaled tensors. Specs that the rules say cannot be served must be refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gather.h"
#include "layout.h"

typedef struct tcase {
	const char *name;
	st_dtype dtype;
	uint32_t ndim;
	uint64_t shape[4];
	tp_spec spec;
} tcase;

static uint64_t rng = 88172645463325252ULL;
static uint64_t rnd(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

/* ---- the naive rules ---- */

/* Rank r's share of `units` (first, count, zeros), or -1 if the rules forbid the split. */
static int naive_share(uint64_t units, const tp_spec *s, uint32_t T, uint32_t r, uint64_t *first,
		       uint64_t *count, uint64_t *zeros)
{
	*zeros = 0;
	if (s->pad_to > 1) {
		uint64_t padded = (units + s->pad_to - 1) / s->pad_to * s->pad_to;
		if (padded % T)
			return -1;
		uint64_t per = padded / T;
		uint64_t lo = per * r, hi = per * (r + 1);
		if (lo > units)
			lo = units;
		if (hi > units)
			hi = units;
		*first = lo;
		*count = hi - lo;
		*zeros = per - *count;
		return 0;
	}
	if (units % T == 0) {
		*count = units / T;
		*first = r * *count;
		return 0;
	}
	if ((s->flags & TP_GROUPS) && units < T && T % units == 0) {
		*first = r / (T / units);
		*count = 1;
		return 0;
	}
	if ((s->flags & TP_UNEVEN) && units >= T) {
		/* the first units % T ranks hold one more */
		uint64_t f = 0;
		for (uint32_t k = 0; k < r; k++)
			f += units / T + (k < units % T);
		*first = f;
		*count = units / T + (r < units % T);
		return 0;
	}
	return -1;
}

/* Stored indices along the split axis kept by rank r, in local order (-1 for a zero row), or
 * -1 if unservable. */
static int naive_index_list(const tcase *c, uint32_t T, uint32_t r, int64_t *list, uint64_t *n)
{
	const tp_spec *s = &c->spec;
	uint64_t seg_lo = 0;
	*n = 0;
	for (uint32_t g = 0; g < s->nseg; g++) {
		uint64_t first, count, zeros;
		if (naive_share(s->seg[g], s, T, r, &first, &count, &zeros) < 0)
			return -1;
		int64_t last = -1;
		uint64_t w = s->segu[g] ? s->segu[g] : s->unit;
		for (uint64_t u = first; u < first + count; u++) {
			for (uint64_t k = 0; k < w; k++) {
				uint64_t logical = seg_lo + u * w + k;
				int64_t stored = (int64_t)(logical / s->div);
				if (stored != last)
					list[(*n)++] = stored;
				last = stored;
			}
		}
		if (count && s->div > 1) {
			/* a cut is servable only on stored-element boundaries (or the axis end) */
			uint64_t lo = seg_lo + first * w, hi = seg_lo + (first + count) * w;
			uint64_t L = 0;
			for (uint32_t q = 0; q < s->nseg; q++)
				L += s->seg[q] * (s->segu[q] ? s->segu[q] : s->unit);
			if (lo % s->div || (hi % s->div && hi != L))
				return -1;
		}
		if ((zeros * w) % s->div)
			return -1;
		for (uint64_t z = 0; z < zeros * w / s->div; z++)
			list[(*n)++] = -1;
		seg_lo += s->seg[g] * w;
	}
	return 0;
}

static uint64_t get_bits(const uint8_t *p, uint64_t pos, unsigned nbits)
{
	uint64_t v = 0;
	for (unsigned i = 0; i < nbits; i++)
		v |= (uint64_t)((p[(pos + i) / 8] >> ((pos + i) % 8)) & 1) << i;
	return v;
}

static void put_bits(uint8_t *p, uint64_t pos, unsigned nbits, uint64_t v)
{
	for (unsigned i = 0; i < nbits; i++) {
		uint8_t m = (uint8_t)(1u << ((pos + i) % 8));
		if ((v >> i) & 1)
			p[(pos + i) / 8] |= m;
		else
			p[(pos + i) / 8] &= (uint8_t)~m;
	}
}

/* Naive local tensor: shape and bytes (calloc'd). Returns -1 when unservable. Bytes whose
 * trailing bits are not covered stay zero. */
static int naive_tensor(const tcase *c, const uint8_t *src, uint32_t T, uint32_t r,
			uint64_t *lshape, uint8_t **out, uint64_t *out_len)
{
	unsigned bits = st_dtype_bits(c->dtype);
	memcpy(lshape, c->shape, sizeof c->shape);
	int64_t *list = NULL;
	if (c->spec.kind == TP_SPLIT) {
		if (c->spec.axis >= c->ndim)
			return -1;
		uint64_t L = 0;
		for (uint32_t g = 0; g < c->spec.nseg; g++)
			L += c->spec.seg[g] * (c->spec.segu[g] ? c->spec.segu[g] : c->spec.unit);
		if ((L + c->spec.div - 1) / c->spec.div != c->shape[c->spec.axis])
			return -1;
		list = malloc((L + 64 * 64 + 1) * sizeof *list);
		uint64_t n;
		if (naive_index_list(c, T, r, list, &n) < 0) {
			free(list);
			return -1;
		}
		lshape[c->spec.axis] = n;
	}
	uint64_t numel = 1, snumel = 1;
	for (uint32_t i = 0; i < c->ndim; i++) {
		numel *= lshape[i];
		snumel *= c->shape[i];
	}
	(void)snumel;
	if ((numel * bits) % 8) {
		free(list);
		return -1;
	}
	*out_len = numel * bits / 8;
	*out = calloc(*out_len + 1, 1);
	for (uint64_t i = 0; i < numel; i++) {
		/* local multi-index -> source flat index */
		uint64_t rem = i, src_flat = 0, mul = 1;
		int zero = 0;
		for (int d = (int)c->ndim - 1; d >= 0; d--) {
			uint64_t idx = rem % lshape[d];
			rem /= lshape[d];
			if (list && (uint32_t)d == c->spec.axis) {
				if (list[idx] < 0)
					zero = 1;
				else
					idx = (uint64_t)list[idx];
			}
			src_flat += idx * mul;
			mul *= c->shape[d];
		}
		uint64_t v = zero ? 0 : get_bits(src, src_flat * bits, bits);
		put_bits(*out, i * bits, bits, v);
	}
	/* a sub-byte cut must land on byte boundaries in every row to be servable */
	if (list && bits % 8) {
		uint64_t inner = bits;
		for (uint32_t d = c->spec.axis + 1; d < c->ndim; d++)
			inner *= c->shape[d];
		/* each maximal run of consecutive stored indices must start and end on a byte */
		uint64_t runbits = 0, nl = lshape[c->spec.axis];
		for (uint64_t k = 0; k < nl; k++) {
			if (list[k] < 0)
				continue;
			int starts = k == 0 || list[k - 1] != list[k] - 1;
			int ends = k + 1 == nl || list[k + 1] != list[k] + 1;
			if ((starts && ((uint64_t)list[k] * inner) % 8) ||
			    (ends && ((uint64_t)(list[k] + 1) * inner) % 8))
				runbits = 1;
		}
		uint64_t rowbits = inner * c->shape[c->spec.axis];
		if (runbits || (rowbits % 8 && numel) || ((lshape[c->spec.axis] * inner) % 8)) {
			free(list);
			free(*out);
			return -1;
		}
	}
	free(list);
	return 0;
}

/* ---- building files ---- */

typedef struct file {
	uint8_t *bytes;
	uint64_t size;
	st_header h;
} file;

static uint64_t tensor_bytes(const tcase *c)
{
	uint64_t n = st_dtype_bits(c->dtype);
	for (uint32_t i = 0; i < c->ndim; i++)
		n *= c->shape[i];
	return n / 8;
}

/* Writes the cases in the given order (not the writer's), random data. */
static int src_no_meta; /* make_file writes no __metadata__ (test_header_size) */

static void make_file(const tcase *cs, size_t n, file *f)
{
	st_wbuf w = {.p = NULL};
	for (int pass = 0; pass < 2; pass++) {
		st_meta meta = {"format", "pt"};
		st_w_begin(&w, &meta, src_no_meta ? 0 : 1);
		uint64_t off = 0;
		for (size_t i = 0; i < n; i++) {
			uint64_t b = tensor_bytes(&cs[i]);
			st_w_tensor(&w, cs[i].name, cs[i].dtype, cs[i].ndim, cs[i].shape, off, off + b);
			off += b;
		}
		uint64_t hl = st_w_end(&w);
		if (pass == 0) {
			f->size = hl + off;
			f->bytes = malloc(f->size);
			for (uint64_t i = hl; i < f->size; i++)
				f->bytes[i] = (uint8_t)rnd();
			w.p = (char *)f->bytes;
		}
	}
	tp_err e;
	uint64_t n8 = 0;
	for (int i = 7; i >= 0; i--)
		n8 = (n8 << 8) | f->bytes[i];
	if (st_parse_header((char *)f->bytes + 8, n8, f->size, "src.safetensors", &f->h, &e) < 0)
		fail_msg("source refused: %s", e.msg);
}

static const tcase *case_of(const tcase *cs, size_t n, const char *name)
{
	for (size_t i = 0; i < n; i++)
		if (strcmp(cs[i].name, name) == 0)
			return &cs[i];
	return NULL;
}

static tp_spec split(uint32_t axis, uint64_t units, uint64_t unit, uint32_t flags)
{
	tp_spec s = tp_spec_split(axis, units, unit);
	s.flags = flags;
	return s;
}

static tcase *all_cases(size_t *n)
{
	static tcase cs[20];
	size_t k = 0;
	cs[k++] = (tcase){"col", ST_F32, 2, {48, 5}, split(0, 48, 1, TP_UNEVEN)};
	cs[k++] = (tcase){"row", ST_BF16, 2, {7, 40}, split(1, 40, 1, TP_UNEVEN)};
	cs[k++] = (tcase){"mid", ST_F16, 3, {3, 24, 5}, split(1, 12, 2, TP_UNEVEN)};
	tp_spec qkv = split(0, 8, 4, TP_GROUPS | TP_UNEVEN);
	qkv.nseg = 3;
	qkv.seg[1] = qkv.seg[2] = 2;
	cs[k++] = (tcase){"qkv", ST_BF16, 2, {48, 6}, qkv};
	tp_spec voc = split(0, 100, 1, 0);
	voc.pad_to = 64;
	cs[k++] = (tcase){"vocab", ST_BF16, 2, {100, 3}, voc};
	cs[k++] = (tcase){"scalar", ST_F32, 0, {0}, tp_spec_replicate()};
	cs[k++] = (tcase){"empty0", ST_F32, 2, {0, 4}, split(0, 0, 1, 0)};
	cs[k++] = (tcase){"empty1", ST_F32, 2, {9, 0}, split(0, 9, 1, TP_UNEVEN)};
	cs[k++] = (tcase){"norm", ST_BF16, 1, {16}, tp_spec_replicate()};
	cs[k++] = (tcase){"f4row", ST_F4, 2, {4, 32}, split(1, 16, 2, TP_UNEVEN)};
	tp_spec sc = split(0, 3, 128, TP_UNEVEN);
	sc.div = 128;
	cs[k++] = (tcase){"scale", ST_F32, 2, {3, 4}, sc};
	tp_spec pk = split(1, 8, 4, 0);
	pk.div = 2;
	cs[k++] = (tcase){"u8packed", ST_U8, 2, {5, 16}, pk};
	cs[k++] = (tcase){"i64_3d", ST_I64, 3, {2, 3, 4}, split(2, 4, 1, TP_UNEVEN)};
	cs[k++] = (tcase){"a_log", ST_F32, 4, {1, 1, 8, 1}, split(2, 8, 1, TP_GROUPS)};
	cs[k++] = (tcase){"f6", ST_F6_E2M3, 2, {3, 8}, split(1, 2, 4, 0)};
	/* GDN conv1d [Q (4 key heads of 2) | K (4 of 2) | V (8 value heads of 3)], 1, 3 */
	tp_spec gdn = split(0, 4, 2, 0);
	gdn.nseg = 3;
	gdn.seg[1] = 4;
	gdn.seg[2] = 8;
	gdn.segu[2] = 3;
	cs[k++] = (tcase){"gdn_conv", ST_BF16, 3, {40, 1, 3}, gdn};
	*n = k;
	return cs;
}

/* When set (test_affine_ranks), ranks 2 .. T-2 are checked through layouts made by
 * tp_layout_from_affine from these two (ranks 0 and 1) instead of built on their own. */
static const tp_layout *aff0, *aff1;

static void check_rank(const file *f, const tcase *cs, size_t n, uint32_t T, uint32_t r,
		       long *reads, long *refusals)
{
	/* specs in source order; unservable ones (per the naive rules) are replicated here and
	 * must be refused by the C code on their own */
	tp_spec *specs = calloc(f->h.n, sizeof *specs);
	uint64_t lsh[ST_MAX_DIMS];
	uint8_t *tb[20] = {0};
	uint64_t tl[20] = {0};
	int ok[20];
	for (size_t i = 0; i < f->h.n; i++) {
		const st_tensor *t = &f->h.t[i];
		const tcase *c = case_of(cs, n, t->name);
		ok[i] = naive_tensor(c, f->bytes + f->h.data_start + t->begin, T, r, lsh, &tb[i], &tl[i]) == 0;
		specs[i] = ok[i] ? c->spec : tp_spec_replicate();
		if (!ok[i]) {
			tp_cut cut;
			tp_err e;
			if (tp_cut_tensor(t, &c->spec, T, r, &cut, "x", &e) == 0)
				fail_msg("%s at T=%u r=%u: the rules forbid it but it was cut", t->name, T, r);
			(*refusals)++;
			uint64_t dummy;
			uint64_t rs[ST_MAX_DIMS];
			memcpy(rs, c->shape, sizeof rs);
			(void)dummy;
			free(tb[i]);
			tb[i] = malloc(tensor_bytes(c) + 1);
			memcpy(tb[i], f->bytes + f->h.data_start + t->begin, tensor_bytes(c));
			tl[i] = tensor_bytes(c);
		}
	}
	tp_layout L;
	tp_err e;
	if (aff0 && r >= 2 && r + 2 <= T) {
		assert_int_equal(tp_layout_from_affine(aff0, aff1, r, &L), 0);
		assert_null(L.pieces); /* nothing held per rank */
	} else if (tp_layout_build(&f->h, specs, NULL, T, r, "src.safetensors", &L, &e) < 0) {
		fail_msg("T=%u r=%u: layout refused: %s", T, r, e.msg);
	}

	/* a rank's own metadata (its header size counted from it and the shared tensor entries:
	 * the prefix the writer fills must agree), on every other rank */
	char rv[16];
	snprintf(rv, sizeof rv, "%u", r * 1000);
	st_meta xm[1] = {{"tpfs.tp_rank", rv}};
	if (r % 2)
		tp_layout_set_meta(&L, xm, 1);

	/* the local header parses back, with local shapes and writer-ordered offsets */
	uint8_t *img = calloc(L.size + 1, 1);
	tp_layout_header(&L, (char *)img);
	uint64_t prefix = 0;
	for (int b = 7; b >= 0; b--)
		prefix = prefix << 8 | img[b];
	assert_int_equal(prefix + 8, L.hdr_size);
	st_header lh;
	if (st_parse_header((char *)img + 8, L.hdr_size - 8, L.size, "rank", &lh, &e) < 0)
		fail_msg("T=%u r=%u: local header refused: %s", T, r, e.msg);
	assert_int_equal(lh.n, f->h.n);
	for (size_t i = 0; i < lh.n; i++) {
		const st_tensor *lt = &lh.t[i];
		size_t si = (size_t)(st_find(&f->h, lt->name) - f->h.t);
		const tcase *c = case_of(cs, n, lt->name);
		uint64_t want[ST_MAX_DIMS];
		uint8_t *dummy = NULL;
		uint64_t dl;
		if (ok[si]) {
			assert_int_equal(naive_tensor(c, f->bytes + f->h.data_start + f->h.t[si].begin, T, r, want, &dummy, &dl), 0);
			free(dummy);
		} else {
			memcpy(want, c->shape, sizeof want);
		}
		for (uint32_t d = 0; d < c->ndim; d++)
			if (lt->shape[d] != want[d])
				fail_msg("T=%u r=%u %s: dim %u is %llu, want %llu", T, r, lt->name, d,
					 (unsigned long long)lt->shape[d], (unsigned long long)want[d]);
		assert_int_equal(lt->end - lt->begin, tl[si]);
		if (i) /* writer order: bits descending, then name */
			assert_true(st_writer_cmp(lh.t[i - 1].dtype, lh.t[i - 1].name, lt->dtype, lt->name) < 0);
		memcpy(img + lh.data_start + lt->begin, tb[si], tl[si]);
	}
	assert_int_equal(lh.data_start + lh.data_len, L.size);
	st_header_free(&lh);

	/* random reads through the mapper and the gather */
	tp_src src = {.fd = -1, .map = f->bytes, .size = f->size};
	uint8_t *buf = malloc(L.size + 64);
	tp_run runs[64];
	for (int k = 0; k < 400; k++) {
		uint64_t off = rnd() % (L.size + 8);
		uint64_t len = (k % 4 == 0) ? rnd() % (L.size + 16) : rnd() % 64;
		size_t cap = 1 + rnd() % 64;
		uint64_t want = off < L.size ? (len < L.size - off ? len : L.size - off) : 0;
		uint64_t got = 0;
		while (got < want) {
			uint64_t cov;
			size_t nr = tp_map(&L, off + got, len - got, runs, cap, &cov);
			assert_true(cov > 0);
			assert_int_equal(tp_runs_bytes(runs, nr), cov);
			for (size_t q = 0; q + 1 < nr; q++) /* merged: no two adjacent source runs */
				assert_false(runs[q].kind == runs[q + 1].kind &&
					     (runs[q].kind == TP_RUN_ZERO || runs[q].off + runs[q].len == runs[q + 1].off));
			if (tp_gather_cpu(runs, nr, &src, img, buf + got, &e) < 0)
				fail_msg("gather: %s", e.msg);
			got += cov;
		}
		uint64_t cov;
		assert_int_equal(tp_map(&L, off + got, len - got, runs, cap, &cov), 0);
		if (memcmp(buf, img + off, want) != 0)
			fail_msg("T=%u r=%u: read [%llu, +%llu) differs from the reference", T, r,
				 (unsigned long long)off, (unsigned long long)want);
		(*reads)++;
	}
	free(buf);
	free(img);
	for (size_t i = 0; i < f->h.n; i++)
		free(tb[i]);
	free(specs);
	tp_layout_free(&L);
}

static void test_random_reads(void **state)
{
	(void)state;
	size_t n;
	tcase *cs = all_cases(&n);
	long reads = 0, refusals = 0;
	for (int order = 0; order < 3; order++) {
		/* shuffle the source order: the rank files must not depend on it */
		for (size_t i = n - 1; i > 0 && order; i--) {
			size_t j = rnd() % (i + 1);
			tcase tmp = cs[i];
			cs[i] = cs[j];
			cs[j] = tmp;
		}
		file f;
		make_file(cs, n, &f);
		uint32_t Ts[] = {1, 2, 3, 4, 8};
		for (size_t ti = 0; ti < 5; ti++)
			for (uint32_t r = 0; r < Ts[ti]; r++)
				check_rank(&f, cs, n, Ts[ti], r, &reads, &refusals);
		st_header_free(&f.h);
		free(f.bytes);
	}
	printf("random reads compared: %ld, unservable cuts refused: %ld\n", reads, refusals);
	assert_true(reads > 10000);
	assert_true(refusals > 0);
}

/* Ranks whose pieces are rank 0's shifted (tp_layout_affine): every case whose cuts the naive
 * rules allow on every rank and whose spec is affine, at T = 4, 6, 8, 16, read through layouts
 * that hold no pieces, against the same naive reference; and a file with one uneven split is
 * not taken for affine. */
static void test_affine_ranks(void **state)
{
	(void)state;
	size_t n;
	tcase *all = all_cases(&n);
	long reads = 0, refusals = 0, files = 0;
	uint32_t Ts[] = {4, 6, 8, 16};
	for (size_t ti = 0; ti < 4; ti++) {
		uint32_t T = Ts[ti];
		tcase *cs = calloc(n, sizeof *cs);
		size_t k = 0;
		for (size_t i = 0; i < n; i++) {
			const tp_spec *sp = &all[i].spec;
			int aff = sp->kind == TP_REPLICATE || (sp->kind == TP_SPLIT && sp->pad_to <= 1);
			for (uint32_t q = 0; q < sp->nseg && sp->kind == TP_SPLIT; q++)
				aff &= sp->seg[q] % T == 0;
			file one;
			make_file(&all[i], 1, &one);
			for (uint32_t r = 0; r < T && aff; r++) {
				uint64_t lsh[ST_MAX_DIMS], len;
				uint8_t *b = NULL;
				aff = naive_tensor(&all[i], one.bytes + one.h.data_start, T, r, lsh, &b, &len) == 0;
				free(b);
			}
			st_header_free(&one.h);
			free(one.bytes);
			if (aff)
				cs[k++] = all[i];
		}
		assert_true(k >= 4);
		file f;
		make_file(cs, k, &f);
		tp_spec *specs = calloc(f.h.n, sizeof *specs);
		for (size_t i = 0; i < f.h.n; i++)
			specs[i] = case_of(cs, k, f.h.t[i].name)->spec;
		assert_true(tp_layout_affine(&f.h, specs, T));
		tp_layout L0, L1;
		tp_err e;
		assert_int_equal(tp_layout_build_ordered(&f.h, specs, NULL, NULL, NULL, T, 0, "s", &L0, &e), 0);
		assert_int_equal(tp_layout_build_ordered(&f.h, specs, NULL, NULL, &L0, T, 1, "s", &L1, &e), 0);
		assert_true(L1.borrowed);
		aff0 = &L0, aff1 = &L1;
		for (uint32_t r = 0; r < T; r++)
			check_rank(&f, cs, k, T, r, &reads, &refusals);
		aff0 = aff1 = NULL;
		/* one uneven split and the file is not affine */
		tp_spec keep = specs[0];
		specs[0] = split(0, T + 1, 1, TP_UNEVEN);
		assert_false(tp_layout_affine(&f.h, specs, T));
		specs[0] = keep;
		tp_layout_free(&L1);
		tp_layout_free(&L0);
		st_header_free(&f.h);
		free(f.bytes);
		free(specs);
		free(cs);
		files++;
	}
	assert_false(tp_layout_affine(NULL, NULL, 3)); /* T < 4: never */
	printf("affine ranks: %ld files, %ld reads compared\n", files, reads);
	assert_int_equal(refusals, 0);
	assert_true(reads > 4000);
}

/* A layout's header size is counted from its metadata and the tensor entries it shares with
 * other ranks (count_header): for names and metadata of every length modulo 8 it must be the
 * size the writer fills in (the prefix), with and without metadata in the source and added. */
static void test_header_size(void **state)
{
	(void)state;
	long checked = 0;
	for (size_t k = 1; k <= 32; k++) {
		src_no_meta = k > 16;
		char name[17] = "wwwwwwwwwwwwwwww";
		name[k > 16 ? k - 16 : k] = 0;
		tcase cs[2] = {{name, ST_F32, 2, {8, 4}, split(0, 8, 1, 0)}, {"n", ST_BF16, 1, {4}, tp_spec_replicate()}};
		file f;
		make_file(cs, 2, &f);
		tp_spec specs[2];
		for (size_t i = 0; i < 2; i++)
			specs[i] = case_of(cs, 2, f.h.t[i].name)->spec;
		for (uint32_t r = 0; r < 2; r++) {
			tp_layout L;
			tp_err e;
			assert_int_equal(tp_layout_build(&f.h, specs, NULL, 2, r, "s", &L, &e), 0);
			for (int j = -1; j <= 8; j++) {
				char v[9] = "vvvvvvvv";
				st_meta xm = {"k", v};
				if (j >= 0)
					v[j] = 0;
				tp_layout_set_meta(&L, j >= 0 ? &xm : NULL, j >= 0 ? 1 : 0);
				char *hb = calloc(L.hdr_size, 1);
				tp_layout_header(&L, hb);
				uint64_t prefix = 0;
				for (int b = 7; b >= 0; b--)
					prefix = prefix << 8 | (uint8_t)hb[b];
				assert_int_equal(prefix + 8, L.hdr_size);
				assert_int_equal(hb[L.hdr_size - 1] == ' ' || hb[L.hdr_size - 1] == '}', 1);
				free(hb);
				checked++;
			}
			tp_layout_free(&L);
		}
		st_header_free(&f.h);
		free(f.bytes);
	}
	src_no_meta = 0;
	assert_int_equal(checked, 32 * 2 * 10);
}

/* Union over ranks of a split tensor is exactly the original (even split, no padding). */
static void test_union_is_original(void **state)
{
	(void)state;
	tcase cs[] = {{"row", ST_BF16, 2, {5, 24}, split(1, 24, 1, 0)}};
	file f;
	make_file(cs, 1, &f);
	const uint8_t *orig = f.bytes + f.h.data_start;
	for (uint32_t T = 1; T <= 8; T *= 2) {
		uint8_t rebuilt[5 * 24 * 2];
		for (uint32_t r = 0; r < T; r++) {
			tp_layout L;
			tp_err e;
			assert_int_equal(tp_layout_build(&f.h, &cs[0].spec, NULL, T, r, "u", &L, &e), 0);
			uint64_t w = 24 / T * 2, cov;
			tp_run runs[64];
			tp_src src = {.fd = -1, .map = f.bytes, .size = f.size};
			uint8_t loc[5 * 24 * 2];
			size_t nr = tp_map(&L, L.hdr_size, L.data_size, runs, 64, &cov);
			assert_int_equal(cov, L.data_size);
			assert_int_equal(tp_gather_cpu(runs, nr, &src, NULL, loc, &e), 0);
			for (int row = 0; row < 5; row++)
				memcpy(rebuilt + row * 48 + r * w, loc + row * w, w);
			tp_layout_free(&L);
		}
		assert_memory_equal(rebuilt, orig, sizeof rebuilt);
	}
	st_header_free(&f.h);
	free(f.bytes);
}

/* The mapper's cost: a 1 MiB read of a row-parallel [7168, 18432] BF16 tensor at T = 2 touches
 * one run per row (18,432 bytes each), about 57, whatever the tensor's size. */
static void test_mapper_cost(void **state)
{
	(void)state;
	char json[512];
	uint64_t nb = 7168ULL * 18432 * 2;
	int jl = snprintf(json, sizeof json,
			  "{\"w\":{\"dtype\":\"BF16\",\"shape\":[7168,18432],\"data_offsets\":[0,%llu]}}",
			  (unsigned long long)nb);
	st_header h;
	tp_err e;
	assert_int_equal(st_parse_header(json, (uint64_t)jl, 8 + (uint64_t)jl + nb, "big", &h, &e), 0);
	tp_spec s = tp_spec_split(1, 18432, 1);
	tp_layout L;
	assert_int_equal(tp_layout_build(&h, &s, NULL, 2, 1, "big", &L, &e), 0);
	static tp_run runs[4096];
	uint64_t cov;
	size_t nr = tp_map(&L, L.hdr_size + L.data_size / 2 + 1000, 1 << 20, runs, 4096, &cov);
	assert_int_equal(cov, 1 << 20);
	printf("1 MiB read of a row-parallel [7168, 18432] BF16 tensor at T=2: %zu runs\n", nr);
	assert_true(nr <= (1 << 20) / 18432 + 2);
	assert_true(nr >= (1 << 20) / 18432);
	for (size_t i = 2; i < nr; i++) /* after the first, partial run: one run per row */
		assert_int_equal(runs[i].off - runs[i - 1].off, 36864);
	tp_layout_free(&L);
	st_header_free(&h);
}

/* Reads the whole rank file of L (header and data) through tp_map and the CPU gather. */
static uint8_t *read_rank(const tp_layout *L, const file *f)
{
	uint8_t *img = calloc(L->size + 1, 1), *buf = malloc(L->size + 1);
	tp_layout_header(L, (char *)img);
	tp_src src = {.fd = -1, .map = f->bytes, .size = f->size};
	tp_run runs[8];
	tp_err e;
	uint64_t got = 0;
	while (got < L->size) {
		uint64_t cov;
		size_t nr = tp_map(L, got, L->size - got, runs, 8, &cov);
		assert_true(cov > 0);
		if (tp_gather_cpu(runs, nr, &src, img, buf + got, &e) < 0)
			fail_msg("gather: %s", e.msg);
		got += cov;
	}
	free(img);
	return buf;
}

/* Expert parallelism: E = 8 experts' tensors owned (TP_OWNED), next to a split and a replicated
 * tensor. Per the placement rule written here (rank r holds experts [r*E/T, (r+1)*E/T)), for
 * T = 1, 2, 4, 8 and every rank: the rank file's header (parsed back) names exactly the rank's
 * experts plus the others, each expert tensor's bytes are the source's whole tensor, the split
 * tensor is cut as without experts, and loc marks the other experts absent. A file holding only
 * other ranks' experts is a valid safetensors file with no tensor. E = 8 over T = 3 and an
 * owner past E are refused. */
static void test_owned_experts(void **state)
{
	(void)state;
	enum { E = 8 };
	tcase cs[2 * E + 2];
	char names[2 * E][48];
	size_t n = 0;
	for (int x = 0; x < E; x++) {
		snprintf(names[2 * x], sizeof names[0], "layers.1.experts.%d.w1.weight", x);
		snprintf(names[2 * x + 1], sizeof names[0], "layers.1.experts.%d.w1.weight_scale_inv", x);
		tp_spec o = tp_spec_owned(E, (uint64_t)x);
		o.flags = TP_EXPERT;
		cs[n++] = (tcase){names[2 * x], ST_F8_E4M3, 2, {24, 16}, o};
		cs[n++] = (tcase){names[2 * x + 1], ST_F32, 2, {1, 1}, o};
	}
	cs[n++] = (tcase){"layers.1.attn.q.weight", ST_BF16, 2, {16, 6}, split(0, 8, 2, 0)};
	cs[n++] = (tcase){"layers.1.norm.weight", ST_F32, 1, {6}, tp_spec_replicate()};
	file f;
	make_file(cs, n, &f);
	tp_spec *specs = calloc(f.h.n, sizeof *specs);
	for (size_t i = 0; i < f.h.n; i++)
		specs[i] = case_of(cs, n, f.h.t[i].name)->spec;
	uint32_t Ts[] = {1, 2, 4, 8};
	for (size_t ti = 0; ti < 4; ti++) {
		uint32_t T = Ts[ti];
		for (uint32_t r = 0; r < T; r++) {
			tp_layout L;
			tp_err e;
			if (tp_layout_build(&f.h, specs, NULL, T, r, "src.safetensors", &L, &e) < 0)
				fail_msg("T=%u r=%u: %s", T, r, e.msg);
			uint8_t *img = read_rank(&L, &f);
			st_header lh;
			uint64_t jl = 0;
			for (int i = 7; i >= 0; i--)
				jl = (jl << 8) | img[i];
			if (st_parse_header((char *)img + 8, jl, L.size, "rank", &lh, &e) < 0)
				fail_msg("T=%u r=%u: rank header refused: %s", T, r, e.msg);
			size_t want_n = 2 * (E / T) + 2, nexp = 0;
			assert_int_equal(lh.n, want_n);
			for (size_t i = 0; i < f.h.n; i++) {
				const st_tensor *t = &f.h.t[i];
				const st_tensor *lt = st_find(&lh, t->name);
				int x = -1;
				sscanf(t->name, "layers.1.experts.%d.", &x);
				if (x >= 0) {
					int mine = x >= (int)(r * E / T) && x < (int)((r + 1) * E / T);
					if (!mine) {
						if (lt || L.loc[i] != UINT32_MAX)
							fail_msg("T=%u r=%u: %s present on a rank that does not hold expert %d", T, r, t->name, x);
						continue;
					}
					if (!lt)
						fail_msg("T=%u r=%u: %s missing", T, r, t->name);
					nexp++;
					assert_int_equal(lt->ndim, t->ndim);
					assert_memory_equal(lt->shape, t->shape, t->ndim * sizeof t->shape[0]);
					assert_int_equal(lt->end - lt->begin, t->end - t->begin);
					assert_memory_equal(img + lh.data_start + lt->begin, f.bytes + f.h.data_start + t->begin,
							    t->end - t->begin);
				} else if (strstr(t->name, "attn")) {
					/* 8 units of 2 rows, evenly: rows [16r/T, 16(r+1)/T) of 6 BF16 */
					assert_non_null(lt);
					assert_int_equal(lt->shape[0], 16 / T);
					assert_memory_equal(img + lh.data_start + lt->begin,
							    f.bytes + f.h.data_start + t->begin + (uint64_t)r * (16 / T) * 12, (16 / T) * 12);
				} else {
					assert_non_null(lt);
					assert_memory_equal(img + lh.data_start + lt->begin, f.bytes + f.h.data_start + t->begin, 24);
				}
			}
			assert_int_equal(nexp, 2 * (E / T));
			assert_int_equal(L.nexpert, 2 * (E / T));
			assert_int_equal(L.expert_bytes, (E / T) * (24 * 16 + 4));
			st_header_free(&lh);
			free(img);
			tp_layout_free(&L);
		}
	}
	/* a file of expert 7's tensors only: empty on every other rank, still a valid file */
	file g;
	make_file(&cs[14], 2, &g);
	tp_spec gs[2] = {cs[14].spec, cs[15].spec};
	for (uint32_t r = 0; r < 4; r++) {
		tp_layout L;
		tp_err e;
		assert_int_equal(tp_layout_build(&g.h, gs, NULL, 4, r, "expert7.safetensors", &L, &e), 0);
		uint8_t *img = read_rank(&L, &g);
		st_header lh;
		uint64_t jl = 0;
		for (int i = 7; i >= 0; i--)
			jl = (jl << 8) | img[i];
		if (st_parse_header((char *)img + 8, jl, L.size, "rank", &lh, &e) < 0)
			fail_msg("r=%u: rank header refused: %s", r, e.msg);
		assert_int_equal(lh.n, r == 3 ? 2 : 0);
		assert_int_equal(L.size, L.hdr_size + (r == 3 ? 24 * 16 + 4 : 0));
		assert_int_equal(L.hdr_size % 8, 0);
		st_header_free(&lh);
		free(img);
		tp_layout_free(&L);
	}
	st_header_free(&g.h);
	free(g.bytes);
	/* 8 experts over 3 ranks, and an expert past the count: refused */
	tp_layout L;
	tp_err e;
	assert_int_equal(tp_layout_build(&f.h, specs, NULL, 3, 0, "src.safetensors", &L, &e), -1);
	assert_non_null(strstr(e.msg, "8 units do not divide over 3 ranks"));
	assert_non_null(strstr(e.msg, "this tensor can be split for T = 1, 2, 4, 8"));
	tp_spec bad = tp_spec_owned(E, E);
	tp_cut c;
	assert_int_equal(tp_cut_tensor(&f.h.t[0], &bad, 2, 0, &c, "x", &e), -1);
	assert_non_null(strstr(e.msg, "belongs to unit 8 of 8, past the last"));
	free(specs);
	st_header_free(&f.h);
	free(f.bytes);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_random_reads),
		cmocka_unit_test(test_affine_ranks),
		cmocka_unit_test(test_header_size),
		cmocka_unit_test(test_union_is_original),
		cmocka_unit_test(test_mapper_cost),
		cmocka_unit_test(test_owned_experts),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
