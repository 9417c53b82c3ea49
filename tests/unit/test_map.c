/* test_map.c: layouts (one source file per rank file), the range mapper and the CPU gather against a
 * naive reference.
 *
 * The reference (naive.c) materializes every rank file in the simplest way: for each local element,
 * find the source element by mapping the split axis index through an index list computed from the
 * distribution rules (written there again, independently of spec.c), and copy its bits. The
 * local header is checked by parsing it back. Then thousands of random (offset, length) reads
 * through tp_map + tp_gather_cpu, with small run buffers to force resumption, must equal the
 * materialized bytes. T in {1, 2, 3, 4, 8}; column, row and middle-axis splits; segments;
 * even, uneven, replicated-group and padded distributions; scalar, empty, 3-D, sub-byte and
 * block-scaled tensors. Specs that the rules say cannot be served must be refused. Also: ranks made
 * affine from ranks 0 and 1, the header's size, the union of the ranks, the mapper's cost and owned
 * experts. test_served.c checks the served files of an engine view (pieces of several sources). */
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
#include "layout.h"
#include "naive.h"

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
