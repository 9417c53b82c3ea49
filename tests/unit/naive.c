/* naive.c: the naive reference of naive.h (the distribution rules written again, bit by bit, and the in-memory
 * source files), shared by test_map.c and test_served.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "naive.h"

static uint64_t rng = 88172645463325252ULL;
uint64_t rnd(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

void rnd_seed(uint64_t state)
{
	rng = state;
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
int naive_tensor(const tcase *c, const uint8_t *src, uint32_t T, uint32_t r,
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

uint64_t tensor_bytes(const tcase *c)
{
	uint64_t n = st_dtype_bits(c->dtype);
	for (uint32_t i = 0; i < c->ndim; i++)
		n *= c->shape[i];
	return n / 8;
}

int src_no_meta;

/* Writes the cases in the given order (not the writer's), random data. */
void make_file(const tcase *cs, size_t n, file *f)
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

const tcase *case_of(const tcase *cs, size_t n, const char *name)
{
	for (size_t i = 0; i < n; i++)
		if (strcmp(cs[i].name, name) == 0)
			return &cs[i];
	return NULL;
}

tp_spec split(uint32_t axis, uint64_t units, uint64_t unit, uint32_t flags)
{
	tp_spec s = tp_spec_split(axis, units, unit);
	s.flags = flags;
	return s;
}

tcase *all_cases(size_t *n)
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
