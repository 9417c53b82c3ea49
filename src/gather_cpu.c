/* gather_cpu.c: the CPU gather backend, the reference every other backend is compared to, and
 * the only one that widens (TP_RUN_WIDEN: engine views' BF16 or F16 tensors served as F32) and
 * transposes (TP_RUN_TRANSPOSE: engine views' matrices served with their last two axes swapped). */
#include "gather.h"

#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "st_format.h"

uint64_t tp_runs_bytes(const tp_run *runs, size_t n)
{
	uint64_t s = 0;
	for (size_t i = 0; i < n; i++)
		s += runs[i].len;
	return s;
}

static int read_src(const tp_src *src, uint64_t off, uint64_t len, uint8_t *dst, tp_err *e)
{
	if (off > src->size || len > src->size - off)
		return tp_fail(e, TP_ECHANGED, "run [%llu, +%llu) lies past the planned source size %llu",
			       (unsigned long long)off, (unsigned long long)len,
			       (unsigned long long)src->size);
	if (src->map) {
		if (tp_src_copy(src, dst, off, len) < 0)
			return tp_fail(e, TP_ECHANGED, "the source could not be read under its mapping at %llu (SIGBUS caught)",
				       (unsigned long long)off);
		return 0;
	}
	while (len) {
		ssize_t r = pread(src->fd, dst, len, (off_t)off);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return tp_fail(e, TP_EIO, "pread at %llu: %s", (unsigned long long)off, strerror(errno));
		if (r == 0)
			return tp_fail(e, TP_ECHANGED, "source ends at %llu, before the planned size %llu",
				       (unsigned long long)off, (unsigned long long)src->size);
		dst += r;
		off += (uint64_t)r;
		len -= (uint64_t)r;
	}
	return 0;
}

/* The F32 bits of a BF16 value (its top 16 bits) and of an F16 value (exact: subnormals
 * normalized, infinities and NaNs kept, the NaN payload shifted). */
static uint32_t bf16_f32(uint16_t h)
{
	return (uint32_t)h << 16;
}

static uint32_t f16_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000) << 16, ex = (h >> 10) & 0x1f, man = h & 0x3ff;
	if (ex == 0x1f)
		return sign | 0x7f800000u | (man << 13);
	if (ex == 0) {
		if (!man)
			return sign;
		ex = 127 - 15 + 1;
		while (!(man & 0x400)) {
			man <<= 1;
			ex--;
		}
		return sign | (ex << 23) | ((man & 0x3ff) << 13);
	}
	return sign | ((ex + 127 - 15) << 23) | (man << 13);
}

/* A TP_RUN_WIDEN run: the 2-byte values read in blocks, widened (little-endian), and the run's
 * bytes of them copied out. */
static int widen(const tp_src *src, const tp_run *r, uint8_t *dst, tp_err *e)
{
	uint16_t in[1024];
	uint32_t outv[1024];
	uint64_t off = r->off, left = r->len, skip = r->skip;
	while (left) {
		uint64_t vals = (skip + left + 3) / 4;
		if (vals > 1024)
			vals = 1024;
		if (read_src(src, off, vals * 2, (uint8_t *)in, e) < 0)
			return -1;
		for (uint64_t k = 0; k < vals; k++) {
			uint16_t h;
			memcpy(&h, (uint8_t *)in + 2 * k, 2);
			outv[k] = r->from == ST_F16 ? f16_f32(h) : bf16_f32(h);
		}
		uint64_t l = vals * 4 - skip;
		if (l > left)
			l = left;
		memcpy(dst, (uint8_t *)outv + skip, l);
		dst += l;
		left -= l;
		off += vals * 2;
		skip = 0;
	}
	return 0;
}

/* Copies the bytes of element bytes [a, a + es) that lie in [lo, hi) from v to out + (x - lo) for
 * each byte x: an element wholly inside is one copy. */
static inline void put_elem(uint8_t *out, const uint8_t *v, uint64_t a, uint64_t es, uint64_t lo, uint64_t hi)
{
	if (a >= lo && a + es <= hi) {
		memcpy(out + (a - lo), v, es);
		return;
	}
	for (uint64_t b = 0; b < es; b++)
		if (a + b >= lo && a + b < hi)
			out[a + b - lo] = v[b];
}

/* A TP_RUN_TRANSPOSE run (run.h): output row q = m x C + c holds column c of matrix m, R elements.
 * Output rows are made in batches of up to TB columns of one matrix (TBYTES bytes of each source
 * row); for each batch, the source rows in chunks of TR: each source row's TB elements read in one
 * copy into a 32 KiB tile, then scattered to their output rows. A partial first or last output row
 * is a batch of its own, so only the elements the run's bytes need are read. */
static int transpose(const tp_src *src, const tp_run *r, uint8_t *dst, tp_err *e)
{
	enum { TBYTES = 512, TR = 64 };
	uint8_t tile[TR][TBYTES];
	const uint64_t es = r->from, R = r->rows, C = r->cols, lo = r->pos, hi = r->pos + r->len, TB = TBYTES / (es ? es : 1);
	if ((es != 1 && es != 2 && es != 4 && es != 8) || !R || !C || !r->rep || r->rep % (C * es))
		return tp_fail(e, TP_EINVAL, "a transposed run of %llu x %llu elements of %llu bytes in rows of %llu bytes",
			       (unsigned long long)R, (unsigned long long)C, (unsigned long long)es,
			       (unsigned long long)r->rep);
	uint64_t k = lo / es, kend = (hi + es - 1) / es; /* output elements [k, kend) */
	while (k < kend) {
		uint64_t q = k / R, m = q / C, c = q % C, r0 = k % R, nb, ra, rb;
		if (r0 || kend - k < R) { /* a partial row alone */
			nb = 1;
			ra = r0;
			rb = kend - k < R - r0 ? r0 + (kend - k) : R;
		} else {
			nb = (kend - k) / R;
			nb = nb < TB ? nb : TB;
			nb = nb < C - c ? nb : C - c;
			ra = 0;
			rb = R;
		}
		for (uint64_t r1 = ra; r1 < rb; r1 += TR) {
			uint64_t r2 = rb - r1 < TR ? rb : r1 + TR;
			for (uint64_t x = r1; x < r2; x++) { /* source row x of matrix m: columns [c, c + nb) */
				uint64_t lb = ((m * R + x) * C + c) * es;
				if (read_src(src, tp_run_t_src(r, lb), nb * es, tile[x - r1], e) < 0)
					return -1;
			}
			for (uint64_t j = 0; j < nb; j++) {
				uint64_t a = ((q + j) * R + r1) * es; /* output byte of element (q + j, r1) */
				if (es == 2 && a >= lo && a + (r2 - r1) * 2 <= hi) {
					uint8_t *o = dst + (a - lo);
					for (uint64_t x = r1; x < r2; x++, o += 2)
						memcpy(o, tile[x - r1] + j * 2, 2);
					continue;
				}
				for (uint64_t x = r1; x < r2; x++, a += es)
					put_elem(dst, tile[x - r1] + j * es, a, es, lo, hi);
			}
		}
		k = (q + nb) * R < kend ? (q + nb) * R : kend;
	}
	return 0;
}

int tp_gather_cpu(const tp_run *runs, size_t n, const tp_src *src, const uint8_t *hdr,
		  uint8_t *dst, tp_err *e)
{
	for (size_t i = 0; i < n; i++) {
		const tp_run *r = &runs[i];
		switch (r->kind) {
		case TP_RUN_ZERO:
			memset(dst, 0, r->len);
			break;
		case TP_RUN_HDR:
		case TP_RUN_CONST:
			memcpy(dst, hdr + r->off, r->len);
			break;
		case TP_RUN_WIDEN:
			if (r->from != ST_BF16 && r->from != ST_F16)
				return tp_fail(e, TP_EINVAL, "run %zu widens dtype %u: only BF16 and F16 are", i, r->from);
			if (widen(&src[r->src], r, dst, e) < 0)
				return -1;
			break;
		case TP_RUN_TRANSPOSE:
			if (transpose(&src[r->src], r, dst, e) < 0)
				return -1;
			break;
		default:
			if (read_src(&src[r->src], r->off, r->len, dst, e) < 0)
				return -1;
		}
		dst += r->len;
	}
	return 0;
}

static int cpu_gather(void *self, const tp_run *runs, size_t n, const tp_src *src,
		      const uint8_t *hdr, uint8_t *dst, tp_err *e)
{
	(void)self;
	return tp_gather_cpu(runs, n, src, hdr, dst, e);
}

static void cpu_destroy(void *self)
{
	(void)self;
}

const tp_gather_ops tp_gather_cpu_ops = {"cpu", cpu_gather, cpu_destroy};
const tp_gather tp_gather_cpu_backend = {&tp_gather_cpu_ops, NULL};
