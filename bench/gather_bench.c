/* gather_bench.c: CPU against CUDA gather throughput, for runs of 2 B to 64 KiB and covering spans
 * of 1 MiB to 1 GiB (each run is half of a stride, as a row-parallel cut at T = 2), printing a
 * table and, per run size, the smallest span from which CUDA is faster (the crossover that sets
 * --cuda-min-runs / --cuda-min-bytes). Without a usable GPU it prints the CPU column and why.
 *
 *   gather_bench [MAX_SPAN_MIB]   (default 1024; the source buffer is that large) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gather_module.h"

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Output bytes per second of g (NULL: CPU) gathering `runs` over the span, best of 3. */
static double measure(const tp_gather *g, const tp_run *runs, size_t n, const tp_src *src, uint8_t *dst, uint64_t out)
{
	double best = 0;
	for (int k = 0; k < 3; k++) {
		tp_err e;
		double t0 = now();
		int rc = g ? g->ops->gather(g->self, runs, n, src, NULL, dst, &e) : tp_gather_cpu(runs, n, src, NULL, dst, &e);
		double dt = now() - t0;
		if (rc < 0) {
			fprintf(stderr, "gather failed: %s\n", e.msg);
			return 0;
		}
		if (out / dt > best)
			best = (double)out / dt;
	}
	return best;
}

int main(int argc, char **argv)
{
	uint64_t max_span = (argc > 1 ? strtoull(argv[1], NULL, 10) : 1024) << 20;
	uint8_t *buf = malloc(max_span), *dst = malloc(max_span / 2 + 64);
	if (!buf || !dst)
		return 1;
	for (uint64_t i = 0; i < max_span; i++)
		buf[i] = (uint8_t)(i * 131);
	tp_src src = {.fd = -1, .map = buf, .size = max_span};
	char why[512];
	tp_gather g = {0};
	int have = tp_cuda_available(why, sizeof why) == 0 && tp_cuda_load(&g, why, sizeof why) == 0;
	printf("CUDA: %s\n\n%10s %10s %10s %12s %12s %8s\n", why, "run", "span", "runs", "cpu GB/s",
	       "cuda GB/s", "cuda/cpu");
	static const uint64_t sizes[] = {2, 8, 64, 512, 4096, 65536};
	for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
		uint64_t crossover = 0;
		for (uint64_t span = 1 << 20; span <= max_span; span *= 4) {
			size_t n = (size_t)(span / (2 * sizes[si]));
			tp_run *runs = malloc(n * sizeof *runs);
			for (size_t i = 0; i < n; i++)
				runs[i] = (tp_run){.off = 2 * sizes[si] * i, .len = sizes[si], .kind = TP_RUN_SRC};
			uint64_t out = n * sizes[si];
			double c = measure(NULL, runs, n, &src, dst, out);
			double d = have ? measure(&g, runs, n, &src, dst, out) : 0;
			if (have && d > c && !crossover)
				crossover = span;
			if (have)
				printf("%10llu %9lluM %10zu %12.2f %12.2f %8.2f\n", (unsigned long long)sizes[si],
				       (unsigned long long)(span >> 20), n, c / 1e9, d / 1e9, d / c);
			else
				printf("%10llu %9lluM %10zu %12.2f %12s %8s\n", (unsigned long long)sizes[si],
				       (unsigned long long)(span >> 20), n, c / 1e9, "-", "-");
			free(runs);
		}
		if (have)
			printf("  run %llu B: %s%s\n", (unsigned long long)sizes[si],
			       crossover ? "CUDA wins from a span of MiB " : "CUDA never wins in this range", "");
		if (have && crossover)
			printf("  crossover: runs of %llu B, span >= %llu MiB\n", (unsigned long long)sizes[si],
			       (unsigned long long)(crossover >> 20));
	}
	if (g.ops)
		g.ops->destroy(g.self);
	free(buf);
	free(dst);
	return 0;
}
