/* test_spec.c: distributions (even, uneven, replicated groups, padded) and tensor cuts (local
 * shapes, gather programs, refusals), with expected values written from the rules in
 * design.md and tp-rules.md section 1. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <string.h>

#include "spec.h"

static tp_share share(uint64_t units, uint32_t flags, uint64_t pad, uint32_t T, uint32_t r)
{
	tp_spec s = tp_spec_split(0, units, 1);
	s.flags = flags;
	s.pad_to = pad;
	tp_share sh;
	tp_err e;
	if (tp_share_of(units, &s, T, r, &sh, "x", &e) < 0)
		fail_msg("units %llu T %u r %u refused: %s", (unsigned long long)units, T, r, e.msg);
	return sh;
}

static void refuse_share(uint64_t units, uint32_t flags, uint64_t pad, uint32_t T, const char *want)
{
	tp_spec s = tp_spec_split(0, units, 1);
	s.flags = flags;
	s.pad_to = pad;
	tp_share sh;
	tp_err e;
	tp_err_clear(&e);
	int rc = tp_share_of(units, &s, T, 0, &sh, "ctx", &e);
	if (rc == 0 || !strstr(e.msg, want))
		fail_msg("units %llu T %u: rc %d msg '%s' (want '%s')", (unsigned long long)units, T, rc, e.msg, want);
}

static void test_even(void **state)
{
	(void)state;
	for (uint32_t r = 0; r < 4; r++) {
		tp_share s = share(8, 0, 0, 4, r);
		assert_int_equal(s.first, 2 * r);
		assert_int_equal(s.count, 2);
		assert_int_equal(s.zeros, 0);
	}
	tp_share z = share(0, 0, 0, 4, 3); /* an empty axis splits into nothing */
	assert_int_equal(z.count, 0);
	refuse_share(10, 0, 0, 4, "10 units do not divide over 4 ranks (the rule does not allow an uneven split)");
}

static void test_uneven(void **state)
{
	(void)state;
	/* 64 heads over 3 ranks: 22/21/21 starting at 0, 22, 43 */
	uint64_t first[] = {0, 22, 43}, count[] = {22, 21, 21};
	for (uint32_t r = 0; r < 3; r++) {
		tp_share s = share(64, TP_UNEVEN, 0, 3, r);
		assert_int_equal(s.first, first[r]);
		assert_int_equal(s.count, count[r]);
	}
	/* even stays even when allowed to be uneven */
	assert_int_equal(share(64, TP_UNEVEN, 0, 4, 3).first, 48);
	refuse_share(2, TP_UNEVEN, 0, 4, "fewer units than ranks");
}

static void test_groups(void **state)
{
	(void)state;
	/* 2 KV heads over 8 ranks: ranks 0-3 keep head 0, ranks 4-7 head 1 */
	for (uint32_t r = 0; r < 8; r++) {
		tp_share s = share(2, TP_GROUPS, 0, 8, r);
		assert_int_equal(s.first, r / 4);
		assert_int_equal(s.count, 1);
	}
	assert_int_equal(share(1, TP_GROUPS, 0, 3, 2).first, 0);
	refuse_share(2, TP_GROUPS, 0, 3, "replicated groups need T to be a multiple");
	refuse_share(2, 0, 0, 4, "does not allow replicated groups");
}

static void test_padded(void **state)
{
	(void)state;
	/* vLLM: V = 1000 -> Vp = 1024, P = 256 rows per rank at T = 4 */
	for (uint32_t r = 0; r < 4; r++) {
		tp_share s = share(1000, 0, 64, 4, r);
		assert_int_equal(s.first, 256 * r);
		assert_int_equal(s.count, r < 3 ? 256 : 1000 - 768);
		assert_int_equal(s.zeros, r < 3 ? 0 : 24);
	}
	/* V = 100 at T = 4 with padding 64: Vp = 128, P = 32; rank 3 has 4 real rows */
	tp_share s = share(100, 0, 64, 4, 3);
	assert_int_equal(s.first, 96);
	assert_int_equal(s.count, 4);
	assert_int_equal(s.zeros, 28);
	refuse_share(1000, 0, 64, 3, "1000 units padded to 1024 (a multiple of 64) do not divide over 3 ranks");
	refuse_share(5, 0, 0, 1024 + 1, "out of range");
}

static st_tensor tensor(st_dtype d, uint32_t ndim, const uint64_t *shape)
{
	st_tensor t;
	memset(&t, 0, sizeof t);
	t.name = "t";
	t.dtype = d;
	t.ndim = ndim;
	uint64_t n = st_dtype_bits(d);
	for (uint32_t i = 0; i < ndim; i++) {
		t.shape[i] = shape[i];
		n *= shape[i];
	}
	t.end = n / 8;
	return t;
}

static tp_cut cut(const st_tensor *t, const tp_spec *s, uint32_t T, uint32_t r)
{
	tp_cut c;
	tp_err e;
	if (tp_cut_tensor(t, s, T, r, &c, "t", &e) < 0)
		fail_msg("cut refused: %s", e.msg);
	return c;
}

static void refuse_cut(const st_tensor *t, const tp_spec *s, uint32_t T, const char *want)
{
	tp_cut c;
	tp_err e;
	tp_err_clear(&e);
	int rc = -2;
	for (uint32_t r = 0; r < T && rc != -1; r++)
		rc = tp_cut_tensor(t, s, T, r, &c, "t", &e);
	if (rc != -1 || !strstr(e.msg, want))
		fail_msg("expected refusal '%s', got rc %d '%s'", want, rc, e.msg);
}

static void test_cut_column_row(void **state)
{
	(void)state;
	uint64_t sh[] = {6, 4};
	st_tensor t = tensor(ST_BF16, 2, sh);
	tp_spec col = tp_spec_split(0, 6, 1);
	tp_cut c = cut(&t, &col, 2, 1);
	assert_int_equal(c.shape[0], 3);
	assert_int_equal(c.shape[1], 4);
	assert_int_equal(c.size, 24);
	assert_int_equal(c.outer, 1);
	assert_int_equal(c.np, 1);
	assert_int_equal(c.piece[0].off, 24);
	assert_int_equal(c.piece[0].len, 24);

	tp_spec row = tp_spec_split(1, 4, 1);
	c = cut(&t, &row, 2, 1);
	assert_int_equal(c.shape[0], 6);
	assert_int_equal(c.shape[1], 2);
	assert_int_equal(c.outer, 6);   /* one run per row */
	assert_int_equal(c.stride, 8);  /* a source row is 4 BF16 */
	assert_int_equal(c.piece[0].off, 4);
	assert_int_equal(c.piece[0].len, 4);
	assert_int_equal(c.size, 24);

	/* T = 1: one contiguous run, whatever the axis */
	c = cut(&t, &row, 1, 0);
	assert_int_equal(c.outer, 1);
	assert_int_equal(c.piece[0].len, 48);

	tp_spec rep = tp_spec_replicate();
	c = cut(&t, &rep, 8, 7);
	assert_int_equal(c.size, 48);
	assert_int_equal(c.shape[0], 6);
}

static void test_cut_middle_axis_and_heads(void **state)
{
	(void)state;
	/* A_log-like [1, 1, 8, 1] split per head on axis 2 */
	uint64_t sh[] = {1, 1, 8, 1};
	st_tensor t = tensor(ST_F32, 4, sh);
	tp_spec s = tp_spec_split(2, 8, 1);
	tp_cut c = cut(&t, &s, 4, 3);
	assert_int_equal(c.shape[2], 2);
	assert_int_equal(c.piece[0].off, 24);
	assert_int_equal(c.size, 8);
	/* [3, 8, 5] on axis 1 in heads of width 2: rank 1 of 2 keeps rows 4..8 of every block */
	uint64_t sh3[] = {3, 8, 5};
	t = tensor(ST_F32, 3, sh3);
	s = tp_spec_split(1, 4, 2);
	c = cut(&t, &s, 2, 1);
	assert_int_equal(c.shape[1], 4);
	assert_int_equal(c.outer, 3);
	assert_int_equal(c.stride, 8 * 5 * 4);
	assert_int_equal(c.piece[0].off, 4 * 5 * 4);
	assert_int_equal(c.piece[0].len, 4 * 5 * 4);
}

static void test_cut_segments(void **state)
{
	(void)state;
	/* fused [Q (4 heads) | K (2 heads) | V (2 heads)] of head width 3, hidden 2, T = 4 with
	 * groups: Q gets 1 head each, K and V one head per pair of ranks */
	uint64_t sh[] = {24, 2};
	st_tensor t = tensor(ST_F32, 2, sh);
	tp_spec s = tp_spec_split(0, 4, 3);
	s.nseg = 3;
	s.seg[1] = s.seg[2] = 2;
	s.flags = TP_GROUPS;
	tp_cut c = cut(&t, &s, 4, 3);
	assert_int_equal(c.shape[0], 9); /* 3 heads of 3 rows */
	assert_int_equal(c.np, 3);
	uint64_t row = 2 * 4;
	assert_int_equal(c.piece[0].off, 9 * row);        /* Q head 3 */
	assert_int_equal(c.piece[1].off, (12 + 3) * row); /* K head 1 */
	assert_int_equal(c.piece[2].off, (18 + 3) * row); /* V head 1 */
	/* a plain first-rows slice would be wrong: rank 0 must not get K rows */
	c = cut(&t, &s, 4, 0);
	assert_int_equal(c.piece[0].off, 0);
	assert_int_equal(c.piece[0].len, 3 * row);
	assert_int_equal(c.piece[1].off, 12 * row);
	/* T = 1 merges the three segments into one run */
	c = cut(&t, &s, 1, 0);
	assert_int_equal(c.np, 1);
	assert_int_equal(c.piece[0].len, 24 * row);
}

static void test_cut_segment_widths(void **state)
{
	(void)state;
	/* GDN conv1d: [Q (2 key heads of 4) | K (2 of 4) | V (4 value heads of 3)] rows, T = 2:
	 * rank 1 keeps Q head 1, K head 1, V heads 2-3 */
	uint64_t sh[] = {28, 1, 2};
	st_tensor t = tensor(ST_BF16, 3, sh);
	tp_spec s = tp_spec_split(0, 2, 4);
	s.nseg = 3;
	s.seg[1] = 2;
	s.seg[2] = 4;
	s.segu[2] = 3;
	tp_cut c = cut(&t, &s, 2, 1);
	assert_int_equal(c.shape[0], 4 + 4 + 6);
	uint64_t row = 1 * 2 * 2;
	assert_int_equal(c.np, 3);
	assert_int_equal(c.piece[0].off, 4 * row);
	assert_int_equal(c.piece[1].off, (8 + 4) * row);
	assert_int_equal(c.piece[2].off, (16 + 6) * row);
	assert_int_equal(c.piece[2].len, 6 * row);
	/* two value heads over four ranks cannot be split */
	s.seg[2] = 2;
	s.seg[0] = s.seg[1] = 4;
	sh[0] = 4 * 4 * 2 + 2 * 3;
	t = tensor(ST_BF16, 3, sh);
	refuse_cut(&t, &s, 4, "segment 2: 2 units do not divide over 4 ranks");
}

static void test_cut_padded_and_empty(void **state)
{
	(void)state;
	uint64_t sh[] = {100, 2};
	st_tensor t = tensor(ST_BF16, 2, sh);
	tp_spec s = tp_spec_split(0, 100, 1);
	s.pad_to = 64;
	tp_cut c = cut(&t, &s, 4, 3);
	assert_int_equal(c.shape[0], 32);
	assert_int_equal(c.np, 2);
	assert_int_equal(c.piece[0].off, 96 * 4);
	assert_int_equal(c.piece[0].len, 4 * 4);
	assert_int_equal(c.piece[1].off, TP_ZERO);
	assert_int_equal(c.piece[1].len, 28 * 4);

	uint64_t e0[] = {0, 8};
	t = tensor(ST_F32, 2, e0);
	s = tp_spec_split(0, 0, 1);
	c = cut(&t, &s, 2, 1);
	assert_int_equal(c.size, 0);
	assert_int_equal(c.shape[0], 0);
	uint64_t e1[] = {8, 0};
	t = tensor(ST_F32, 2, e1);
	s = tp_spec_split(0, 8, 1);
	c = cut(&t, &s, 2, 1);
	assert_int_equal(c.size, 0);
	assert_int_equal(c.shape[0], 4);
	assert_int_equal(c.shape[1], 0);
}

static void test_cut_quantized(void **state)
{
	(void)state;
	/* FP8 block scale [ceil(384/128), 2]: logical rows 384 in 3 units of 128 over T = 3 */
	uint64_t sh[] = {3, 2};
	st_tensor t = tensor(ST_F32, 2, sh);
	tp_spec s = tp_spec_split(0, 3, 128);
	s.div = 128;
	tp_cut c = cut(&t, &s, 3, 2);
	assert_int_equal(c.shape[0], 1);
	assert_int_equal(c.piece[0].off, 2 * 8);
	/* 256 logical rows over T = 4: cuts at 64 fall inside a block of 128 */
	uint64_t sh2[] = {2, 2};
	t = tensor(ST_F32, 2, sh2);
	s = tp_spec_split(0, 256, 1);
	s.div = 128;
	refuse_cut(&t, &s, 4, "the cut at feature 64 of axis 0 falls inside a block of 128 features");
	/* a partial last block: 300 logical rows, one unit kept whole by a replicated group */
	t = tensor(ST_F32, 2, sh);
	s = tp_spec_split(0, 1, 300);
	s.div = 128;
	s.flags = TP_GROUPS;
	c = cut(&t, &s, 2, 1);
	assert_int_equal(c.shape[0], 3);
	/* packed FP4 as U8 [4, 8] holding K = 16 logical: row split over 2 keeps 4 bytes per row */
	uint64_t sh4[] = {4, 8};
	t = tensor(ST_U8, 2, sh4);
	s = tp_spec_split(1, 16, 1);
	s.div = 2;
	c = cut(&t, &s, 2, 1);
	assert_int_equal(c.shape[1], 4);
	assert_int_equal(c.piece[0].off, 4);
	assert_int_equal(c.outer, 4);
	/* F4 dtype, shape in logical elements: [4, 6] in 2 heads of 3 cuts inside a byte */
	uint64_t sh5[] = {4, 6};
	t = tensor(ST_F4, 2, sh5);
	s = tp_spec_split(1, 2, 3);
	refuse_cut(&t, &s, 2, "not on a byte boundary");
	s = tp_spec_split(1, 3, 2);
	s.flags = TP_UNEVEN;
	c = cut(&t, &s, 3, 1);
	assert_int_equal(c.shape[1], 2);
	assert_int_equal(c.piece[0].off, 1);
	assert_int_equal(c.piece[0].len, 1);
	assert_int_equal(c.stride, 3);
}

static uint64_t xs64(void)
{
	static uint64_t x = 0x9e3779b97f4a7c15ULL;
	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	return x;
}

/* tp_spec_affine's claim, tried on random specs: where it holds, cutting ranks 0, 1 and T-1
 * succeeds exactly when cutting every rank does, and then each rank in between has rank 0's
 * shapes and programs with every piece at rank 0's offset + r x (rank 1's - rank 0's). */
static void test_affine_claim(void **state)
{
	(void)state;
#define RND() xs64()
	static const st_dtype dts[] = {ST_F4, ST_F6_E2M3, ST_U8, ST_BF16, ST_F32};
	long served = 0, refused = 0, tried = 0;
	for (int it = 0; it < 20000; it++) {
		uint32_t T = 4 + RND() % 9;
		uint32_t axis = (uint32_t)(RND() % 2);
		uint64_t units = T * (RND() % 4);
		tp_spec s = tp_spec_split(axis, units, 1 + RND() % 4);
		s.nseg = 1 + (uint32_t)(RND() % 3);
		for (uint32_t k = 0; k < s.nseg; k++) {
			s.seg[k] = T * (RND() % 4);
			s.segu[k] = RND() % 2 ? 0 : 1 + RND() % 4;
		}
		s.div = (uint64_t[]){1, 1, 2, 3, 4, 8}[RND() % 6];
		s.flags = (uint32_t)(RND() % 2 ? TP_UNEVEN : 0);
		s.flags |= (uint32_t)(RND() % 2 ? TP_GROUPS : 0);
		if (!tp_spec_affine(&s, T))
			fail_msg("a split with every segment a multiple of T=%u is not affine", T);
		uint64_t L = 0;
		for (uint32_t k = 0; k < s.nseg; k++)
			L += s.seg[k] * (s.segu[k] ? s.segu[k] : s.unit);
		uint64_t sh[2];
		sh[0] = 1 + RND() % 3;
		sh[1] = 1 + RND() % 3;
		sh[s.axis] = L / s.div + (L % s.div != 0);
		if (RND() % 8 == 0)
			sh[s.axis]++; /* a shape that disagrees: refused on every rank */
		st_tensor t = tensor(dts[RND() % 5], 2, sh);
		tp_cut c[TP_MAX_T > 16 ? 16 : TP_MAX_T];
		int ok_all = 1, ok[16];
		for (uint32_t r = 0; r < T; r++) {
			ok[r] = tp_cut_tensor(&t, &s, T, r, &c[r], "", NULL) == 0;
			ok_all &= ok[r];
		}
		tried++;
		if ((ok[0] && ok[1] && ok[T - 1]) != ok_all)
			fail_msg("T=%u: ranks 0, 1, T-1 %s but not every rank", T, ok_all ? "fail" : "pass");
		if (!ok_all) {
			refused++;
			continue;
		}
		served++;
		for (uint32_t r = 2; r + 1 < T; r++) {
			assert_int_equal(c[r].np, c[0].np);
			assert_int_equal(c[r].size, c[0].size);
			assert_int_equal(c[r].outer, c[0].outer);
			assert_int_equal(c[r].stride, c[0].stride);
			assert_int_equal(c[r].rep, c[0].rep);
			assert_memory_equal(c[r].shape, c[0].shape, sizeof c[0].shape);
			for (uint32_t j = 0; j < c[0].np; j++) {
				assert_int_equal(c[r].piece[j].len, c[0].piece[j].len);
				assert_int_equal(c[r].piece[j].off, c[0].piece[j].off + r * (c[1].piece[j].off - c[0].piece[j].off));
			}
		}
	}
#undef RND
	printf("affine claim: %ld specs, %ld served, %ld refused\n", tried, served, refused);
	assert_true(served > 2000 && refused > 2000);
	/* and what it does not claim */
	tp_spec u = tp_spec_split(0, 10, 1);
	assert_false(tp_spec_affine(&u, 4));
	u = tp_spec_split(0, 8, 1);
	assert_true(tp_spec_affine(&u, 4));
	assert_false(tp_spec_affine(&u, 2)); /* T < 4: ranks 0, 1 and T-1 are every rank anyway */
	u.pad_to = 16;
	assert_false(tp_spec_affine(&u, 4));
	assert_true(tp_spec_affine(&(tp_spec){.kind = TP_REPLICATE}, 8));
	assert_false(tp_spec_affine(&(tp_spec){.kind = TP_OWNED, .nseg = 1, .seg = {8}}, 8));
}

static void test_cut_refusals(void **state)
{
	(void)state;
	uint64_t sh[] = {6, 4};
	st_tensor t = tensor(ST_BF16, 2, sh);
	tp_spec s = tp_spec_split(2, 6, 1);
	refuse_cut(&t, &s, 2, "split axis 2 but the tensor has 2 dimensions");
	s = tp_spec_split(0, 5, 1);
	refuse_cut(&t, &s, 2, "axis 0 has 6 elements but the rule describes 5 (5 units of 1)");
	s = tp_spec_split(0, 3, 2);
	refuse_cut(&t, &s, 2, "3 units do not divide over 2 ranks");
	uint64_t sc[] = {1};
	t = tensor(ST_F32, 0, sc);
	s = tp_spec_split(0, 1, 1);
	refuse_cut(&t, &s, 2, "split axis 0 but the tensor has 0 dimensions");
}

/* An owned tensor (expert parallelism): whole, one contiguous run, on the rank whose even share
 * of the units holds its owner (unit 4 of 6: rank 4 / (6 / T)); absent (no shape, no bytes) on
 * every other rank; refused when the units do not divide over T or the owner is past them. */
static void test_cut_owned(void **state)
{
	(void)state;
	uint64_t sh[] = {8, 5};
	st_tensor t = tensor(ST_BF16, 2, sh);
	tp_spec s = tp_spec_owned(6, 4);
	uint32_t Ts[] = {1, 2, 3, 6};
	for (size_t k = 0; k < 4; k++)
		for (uint32_t r = 0; r < Ts[k]; r++) {
			tp_cut c = cut(&t, &s, Ts[k], r);
			if (r != 4 / (6 / Ts[k])) {
				assert_int_equal(c.absent, 1);
				assert_int_equal(c.size, 0);
				assert_int_equal(c.np, 0);
				continue;
			}
			assert_int_equal(c.absent, 0);
			assert_int_equal(c.size, 80);
			assert_int_equal(c.shape[0], 8);
			assert_int_equal(c.shape[1], 5);
			assert_int_equal(c.np, 1);
			assert_int_equal(c.piece[0].off, 0);
			assert_int_equal(c.piece[0].len, 80);
			assert_int_equal(c.outer, 1);
		}
	refuse_cut(&t, &s, 4, "6 units do not divide over 4 ranks");
	char ts[96];
	tp_spec_working_ts(&t, &s, 64, ts, sizeof ts);
	assert_string_equal(ts, "1, 2, 3, 6");
	s = tp_spec_owned(6, 6);
	refuse_cut(&t, &s, 2, "belongs to unit 6 of 6, past the last");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_even),
		cmocka_unit_test(test_uneven),
		cmocka_unit_test(test_groups),
		cmocka_unit_test(test_padded),
		cmocka_unit_test(test_cut_column_row),
		cmocka_unit_test(test_cut_middle_axis_and_heads),
		cmocka_unit_test(test_cut_segments),
		cmocka_unit_test(test_cut_segment_widths),
		cmocka_unit_test(test_cut_padded_and_empty),
		cmocka_unit_test(test_cut_quantized),
		cmocka_unit_test(test_affine_claim),
		cmocka_unit_test(test_cut_refusals),
		cmocka_unit_test(test_cut_owned),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
