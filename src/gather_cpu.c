/* gather_cpu.c: the CPU gather backend, the reference every other backend is compared to. */
#include "gather.h"

#include <errno.h>
#include <string.h>
#include <unistd.h>

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
