/* test_io.c: page-touch minima, prefetch ranges and rank lists against brute force.
 *
 * The expectation is computed independently of io_plan.c: every rank file of a generated source
 * is walked through tp_map, every source byte a selected rank's runs produce is marked in a
 * bitmap of the source file, and the marked bytes and the pages holding any are counted.
 * tp_io_need_of must give the same numbers for random rank sets over column, row, middle-axis,
 * segmented, replicated-group, uneven, padded, replicated and (expert-parallel) absent tensors,
 * at several page sizes. tp_io_ranges must cover exactly the pages of the runs it is given (of a
 * transposed run: the rows of the matrices it reaches, not the bytes between them), and
 * tp_io_plan every page of the runs of the bytes asked for and no page the rank never needs.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io_plan.h"
#include "layout.h"

static uint64_t rng = 0x9e3779b97f4a7c15ULL;
static uint64_t rnd(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

typedef struct tdef {
	const char *name;
	const char *dtype;
	uint32_t ndim;
	uint64_t shape[3];
	uint32_t bytes; /* per element */
} tdef;

/* Tensors in file order; row widths chosen so rows do and do not straddle pages. */
static const tdef defs[] = {
	{"a.col", "F16", 2, {64, 96}, 2},        /* column split, contiguous */
	{"b.row", "F16", 2, {40, 5632}, 2},      /* row-parallel, 11264-byte rows */
	{"c.row4k", "F32", 2, {24, 8192}, 4},    /* row-parallel, 32 KiB rows */
	{"d.mid", "F16", 3, {4, 24, 100}, 2},    /* middle axis */
	{"e.qkv", "F16", 2, {96, 64}, 2},        /* 3 segments, replicated groups */
	{"f.norm", "F32", 1, {300}, 4},          /* replicated */
	{"g.vocab", "F16", 2, {100, 48}, 2},     /* padded vocab */
	{"h.expert", "F16", 2, {32, 200}, 2},    /* absent on odd ranks (expert parallelism) */
	{"i.odd", "F16", 2, {7, 333}, 2},        /* row-parallel, uneven, odd width */
	{"j.embed", "F16", 2, {512, 1024}, 2},   /* column split, 1 MiB: a rank's share is one long row */
};
#define NDEF (sizeof defs / sizeof defs[0])

static tp_spec spec_of(size_t i, uint32_t r)
{
	tp_spec s;
	switch (i) {
	case 0: s = tp_spec_split(0, 64, 1); s.flags = TP_UNEVEN; break;
	case 1: s = tp_spec_split(1, 5632, 1); s.flags = TP_UNEVEN; break;
	case 2: s = tp_spec_split(1, 64, 128); s.flags = TP_UNEVEN | TP_GROUPS; break;
	case 3: s = tp_spec_split(1, 24, 1); s.flags = TP_UNEVEN; break;
	case 4:
		s = tp_spec_split(0, 8, 8);
		s.nseg = 3;
		s.seg[1] = s.seg[2] = 2;
		s.flags = TP_GROUPS | TP_UNEVEN;
		break;
	case 6: s = tp_spec_split(0, 100, 1); s.pad_to = 64; break;
	case 7:
		if (r % 2) {
			s = tp_spec_replicate();
			s.kind = TP_ABSENT;
		} else {
			s = tp_spec_split(1, 200, 1);
			s.flags = TP_UNEVEN;
		}
		break;
	case 8: s = tp_spec_split(1, 333, 1); s.flags = TP_UNEVEN; break;
	case 9: s = tp_spec_split(0, 512, 1); break;
	default: s = tp_spec_replicate(); break;
	}
	return s;
}

/* The source header (no data needed: only offsets matter). */
static void make_header(st_header *h, uint64_t *fsize)
{
	static char json[4096];
	size_t w = (size_t)snprintf(json, sizeof json, "{");
	uint64_t off = 0;
	for (size_t i = 0; i < NDEF; i++) {
		const tdef *d = &defs[i];
		uint64_t n = d->bytes;
		char shape[64] = "";
		size_t sw = 0;
		for (uint32_t k = 0; k < d->ndim; k++) {
			n *= d->shape[k];
			sw += (size_t)snprintf(shape + sw, sizeof shape - sw, "%s%llu", k ? "," : "", (unsigned long long)d->shape[k]);
		}
		w += (size_t)snprintf(json + w, sizeof json - w, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[%s],\"data_offsets\":[%llu,%llu]}",
				      i ? "," : "", d->name, d->dtype, shape, (unsigned long long)off, (unsigned long long)(off + n));
		off += n;
	}
	w += (size_t)snprintf(json + w, sizeof json - w, "}");
	while (w % 8 != 0)
		json[w++] = ' ';
	*fsize = 8 + w + off;
	tp_err e;
	if (st_parse_header(json, w, *fsize, "io.safetensors", h, &e) < 0)
		fail_msg("header refused: %s", e.msg);
}

static void build(const st_header *h, uint32_t T, tp_layout *lay)
{
	for (uint32_t r = 0; r < T; r++) {
		tp_spec specs[NDEF];
		for (size_t i = 0; i < h->n; i++) {
			size_t d = 0;
			while (strcmp(defs[d].name, h->t[i].name))
				d++;
			specs[i] = spec_of(d, r);
		}
		tp_err e;
		if (tp_layout_build(h, specs, NULL, T, r, "io.safetensors", &lay[r], &e) < 0)
			fail_msg("layout T=%u r=%u: %s", T, r, e.msg);
	}
}

/* Brute force: mark every source byte of every selected rank's runs, count bytes and pages. */
static void brute(const tp_layout *lay, uint32_t T, const uint8_t *sel, uint64_t fsize, uint64_t page,
		  tp_io_need *out)
{
	uint8_t *mark = calloc(fsize, 1);
	static tp_run runs[7];
	for (uint32_t r = 0; r < T; r++) {
		if (!sel[r])
			continue;
		uint64_t off = 0, cov;
		while (off < lay[r].size) {
			size_t n = tp_map(&lay[r], off, 1 + rnd() % 5000, runs, 7, &cov);
			for (size_t k = 0; k < n; k++)
				if (runs[k].kind == TP_RUN_SRC)
					memset(mark + runs[k].off, 1, runs[k].len);
			assert_true(cov > 0);
			off += cov;
		}
	}
	out->bytes = out->pages = 0;
	for (uint64_t p = 0; p * page < fsize; p++) {
		int any = 0;
		for (uint64_t b = p * page; b < (p + 1) * page && b < fsize; b++) {
			out->bytes += mark[b];
			any |= mark[b];
		}
		out->pages += any;
	}
	free(mark);
}

static void test_need_matches_brute_force(void **state)
{
	(void)state;
	st_header h;
	uint64_t fsize;
	make_header(&h, &fsize);
	const uint32_t Ts[] = {1, 2, 4, 8};
	for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
		uint32_t T = Ts[ti];
		tp_layout lay[8];
		build(&h, T, lay);
		for (int trial = 0; trial < 12; trial++) {
			uint8_t sel[8] = {0};
			int nsel = 0;
			for (uint32_t r = 0; r < T; r++)
				nsel += sel[r] = trial == 0 ? 1 : trial <= (int)T ? (uint32_t)(trial - 1) == r : (uint8_t)(rnd() & 1);
			uint64_t page = trial % 3 == 0 ? 4096 : trial % 3 == 1 ? 512 : 64;
			tp_io_need got, want;
			tp_err e;
			assert_int_equal(tp_io_need_of(lay, T, trial == 0 ? NULL : sel, page, &got, &e), 0);
			brute(lay, T, sel, fsize, page, &want);
			if (got.bytes != want.bytes || got.pages != want.pages)
				fail_msg("T=%u trial %d (%d ranks, page %llu): got %llu bytes / %llu pages, brute force %llu / %llu", T,
					 trial, nsel, (unsigned long long)page, (unsigned long long)got.bytes,
					 (unsigned long long)got.pages, (unsigned long long)want.bytes, (unsigned long long)want.pages);
			if (nsel == 0)
				assert_int_equal(got.pages, 0);
		}
		/* all ranks of a split with no absent tensor need every data byte; here odd ranks lack h.expert */
		tp_io_need all;
		tp_err e;
		assert_int_equal(tp_io_need_of(lay, T, NULL, 4096, &all, &e), 0);
		assert_true(all.bytes <= h.data_len);
		if (T == 1)
			assert_int_equal(all.bytes, h.data_len);
		for (uint32_t r = 0; r < T; r++)
			tp_layout_free(&lay[r]);
	}
	st_header_free(&h);
}

/* A random TP_RUN_TRANSPOSE run at source offset `at`: M matrices [R, C] of es-byte elements, cut
 * by their last axis (rows of C elements), by their rows (a matrix a row) or by an outer axis (two
 * matrices a row), rows `stride` apart, some output bytes of them. Returns the source bytes its
 * cut spans. */
static uint64_t random_transpose(tp_run *r, uint64_t at, uint64_t page)
{
	static const uint8_t sizes[] = {1, 2, 4, 8};
	uint64_t es = sizes[rnd() % 4], R = 1 + rnd() % 9, C = 1 + rnd() % 9, M = 1 + rnd() % 4;
	uint64_t mat = R * C * es, how = rnd() % 3, rep = how == 0 ? C * es : how == 1 ? mat : 2 * mat;
	if (how == 2 && M % 2)
		M++;
	uint64_t total = M * mat, pos = rnd() % total, len = 1 + rnd() % (total - pos);
	*r = (tp_run){.kind = TP_RUN_TRANSPOSE, .off = at, .len = len, .src = 0, .pos = pos,
		      .stride = rep + (rnd() % 2 ? rnd() % (3 * page) : 0), .rep = rep, .rows = (uint32_t)R,
		      .cols = (uint32_t)C, .from = (uint8_t)es};
	return (total / rep - 1) * r->stride + rep;
}

/* Marks the pages of the source bytes run r reads, computed here from the run's definition: a
 * transposed run reads every row of each matrix one of its output elements lies in. */
static void mark_run(const tp_run *r, uint64_t page, uint8_t *want)
{
	if (r->kind == TP_RUN_SRC) {
		for (uint64_t p = r->off / page; p <= (r->off + r->len - 1) / page; p++)
			want[p] = 1;
		return;
	}
	if (r->kind != TP_RUN_TRANSPOSE)
		return;
	uint64_t es = r->from, mat = (uint64_t)r->rows * r->cols * es;
	uint64_t m0 = r->pos / mat, m1 = (r->pos + r->len - 1) / mat;
	for (uint64_t x = m0 * mat; x < (m1 + 1) * mat; x++)
		want[(r->off + x / r->rep * r->stride + x % r->rep) / page] = 1;
}

static void test_ranges_cover_the_runs(void **state)
{
	(void)state;
	long transposed = 0;
	for (int trial = 0; trial < 400; trial++) {
		tp_run runs[64];
		size_t nr = 1 + rnd() % 64;
		uint64_t page = (uint64_t)1 << (6 + rnd() % 7), at = rnd() % 4096, limit = 0;
		for (size_t k = 0; k < nr; k++) {
			if (rnd() % 9 == 0)
				at = rnd() % 60000; /* a jump, maybe backwards */
			uint64_t span;
			if (rnd() % 5 == 0) {
				span = random_transpose(&runs[k], at, page);
				transposed++;
			} else {
				runs[k] = (tp_run){.kind = rnd() % 7 == 0 ? TP_RUN_ZERO : rnd() % 11 == 0 ? TP_RUN_HDR : TP_RUN_SRC,
						   .off = at, .len = 1 + rnd() % 3000};
				span = runs[k].len;
			}
			at += span + (rnd() % 3 ? rnd() % 6000 : 0);
			if (at + 1 > limit)
				limit = at + 1;
		}
		uint8_t *want = calloc(limit / page + 2, 1), *got = calloc(limit / page + 2, 1);
		for (size_t k = 0; k < nr; k++)
			mark_run(&runs[k], page, want);
		tp_io_range out[64];
		size_t cap = 1 + rnd() % 8;
		tp_io_at pos = {0, 0};
		while (pos.run < nr) {
			tp_io_at was = pos;
			size_t n = tp_io_ranges(runs, nr, page, out, cap, &pos);
			assert_true(pos.run > was.run || (pos.run == was.run && pos.cut > was.cut)); /* progress */
			assert_true(n <= cap);
			for (size_t j = 0; j < n; j++) {
				assert_int_equal(out[j].lo % page, 0);
				assert_int_equal(out[j].hi % page, 0);
				assert_true(out[j].lo < out[j].hi);
				if (j)
					assert_false(out[j].lo <= out[j - 1].hi && out[j].hi >= out[j - 1].lo); /* merged */
				for (uint64_t p = out[j].lo / page; p < out[j].hi / page; p++) {
					if (!want[p])
						fail_msg("trial %d: range [%llu, %llu) holds page %llu that no run touches", trial,
							 (unsigned long long)out[j].lo, (unsigned long long)out[j].hi, (unsigned long long)p);
					got[p] = 1;
				}
			}
		}
		for (uint64_t p = 0; p <= limit / page; p++)
			if (want[p] && !got[p])
				fail_msg("trial %d: page %llu of a run is in no range", trial, (unsigned long long)p);
		free(want);
		free(got);
	}
	assert_true(transposed > 1000);
}

/* Marks the pages of the source runs of rank-file bytes [a, b) of L. */
static void mark_pages(const tp_layout *L, uint64_t a, uint64_t b, uint64_t page, uint8_t *pages)
{
	static tp_run runs[16];
	while (a < b) {
		uint64_t cov;
		size_t n = tp_map(L, a, b - a, runs, 16, &cov);
		for (size_t k = 0; k < n; k++)
			if (runs[k].kind == TP_RUN_SRC)
				for (uint64_t p = runs[k].off / page; p <= (runs[k].off + runs[k].len - 1) / page; p++)
					pages[p] = 1;
		if (!cov)
			break;
		a += cov;
	}
}

/* tp_io_plan against brute force: for any [a, b) its ranges hold every page of the runs of
 * [a, b) and no page outside the rank's page-touch set, nor outside the span from the first to the
 * last page of those runs (a short read of a long row fetches that read's pages, not the row's:
 * trials 30 on ask for at most 8 KiB); for the whole file, exactly that set. */
static void test_plan_ranges(void **state)
{
	(void)state;
	st_header h;
	uint64_t fsize;
	make_header(&h, &fsize);
	const uint32_t Ts[] = {1, 2, 4, 8};
	for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
		uint32_t T = Ts[ti];
		tp_layout lay[8];
		build(&h, T, lay);
		for (uint32_t r = 0; r < T; r++) {
			const tp_layout *L = &lay[r];
			for (int trial = 0; trial < 60; trial++) {
				uint64_t page = trial % 3 == 0 ? 4096 : trial % 3 == 1 ? 512 : 64, np = fsize / page + 2;
				uint8_t *allowed = calloc(np, 1), *need = calloc(np, 1), *got = calloc(np, 1);
				mark_pages(L, 0, L->size, page, allowed);
				uint64_t a = trial == 0 ? 0 : rnd() % L->size, b = trial == 0 ? L->size : a + 1 + rnd() % (L->size - a);
				if (trial >= 30 && b - a > 8192)
					b = a + 1 + rnd() % 8192;
				mark_pages(L, a, b, page, need);
				uint64_t nlo = np, nhi = 0; /* the span of the pages the runs need */
				for (uint64_t p = 0; p < np; p++)
					if (need[p]) {
						nlo = p < nlo ? p : nlo;
						nhi = p;
					}
				uint64_t x = a;
				while (x < b) {
					tp_io_range out[40];
					uint64_t cov;
					size_t n = tp_io_plan(L, x, b, page, out, 32 + rnd() % 9, &cov);
					assert_true(cov > 0);
					for (size_t j = 0; j < n; j++) {
						assert_int_equal(out[j].lo % page, 0);
						assert_true(out[j].lo < out[j].hi);
						for (uint64_t p = out[j].lo / page; p < out[j].hi / page; p++) {
							if (!allowed[p])
								fail_msg("T=%u r=%u [%llu, %llu) page %llu: a page rank %u never needs", T, r,
									 (unsigned long long)a, (unsigned long long)b, (unsigned long long)p, r);
							if (p < nlo || p > nhi)
								fail_msg("T=%u r=%u [%llu, %llu) page %llu: outside the pages its runs need (%llu to %llu)",
									 T, r, (unsigned long long)a, (unsigned long long)b, (unsigned long long)p,
									 (unsigned long long)nlo, (unsigned long long)nhi);
							got[p] = 1;
						}
					}
					x += cov;
				}
				for (uint64_t p = 0; p < np; p++) {
					if (need[p] && !got[p])
						fail_msg("T=%u r=%u [%llu, %llu) page %llu of its runs is not fetched", T, r,
							 (unsigned long long)a, (unsigned long long)b, (unsigned long long)p);
					if (trial == 0 && got[p] != allowed[p])
						fail_msg("T=%u r=%u whole file: page %llu differs", T, r, (unsigned long long)p);
				}
				free(allowed);
				free(need);
				free(got);
			}
		}
		for (uint32_t r = 0; r < T; r++)
			tp_layout_free(&lay[r]);
	}
	st_header_free(&h);
}

static void test_rank_lists(void **state)
{
	(void)state;
	uint8_t sel[16];
	uint32_t n;
	tp_err e;
	assert_int_equal(tp_ranks_parse("8-15", 16, sel, &n, &e), 0);
	assert_int_equal(n, 8);
	for (int r = 0; r < 16; r++)
		assert_int_equal(sel[r], r >= 8);
	assert_int_equal(tp_ranks_parse("0,3", 4, sel, &n, &e), 0);
	assert_int_equal(n, 2);
	assert_true(sel[0] && !sel[1] && !sel[2] && sel[3]);
	assert_int_equal(tp_ranks_parse("5,0-2,7", 8, sel, &n, &e), 0);
	assert_int_equal(n, 5);
	assert_true(sel[0] && sel[1] && sel[2] && !sel[3] && !sel[4] && sel[5] && !sel[6] && sel[7]);
	assert_int_equal(tp_ranks_parse("0", 1, sel, &n, &e), 0);
	assert_int_equal(n, 1);
	const char *bad[] = {"", ",", "1,", ",1", "1,,2", "a", "1-", "-1", "3-1", "8", "0-8", "1 ,2", "0x1",
			     "1,1", "0-3,2", "99999999999999999999", "+1", "1;2", "1-2-3"};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		memset(sel, 7, sizeof sel);
		if (tp_ranks_parse(bad[i], 8, sel, &n, &e) == 0)
			fail_msg("'%s' was accepted for T=8", bad[i]);
		assert_int_equal(e.code, TP_EINVAL);
		assert_non_null(strstr(e.msg, "--ranks"));
	}
	assert_int_equal(tp_ranks_parse("8", 8, sel, &n, &e), -1);
	assert_non_null(strstr(e.msg, "out of range"));
	assert_int_equal(tp_ranks_parse(NULL, 8, sel, &n, &e), -1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_need_matches_brute_force),
		cmocka_unit_test(test_ranges_cover_the_runs),
		cmocka_unit_test(test_plan_ranges),
		cmocka_unit_test(test_rank_lists),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
