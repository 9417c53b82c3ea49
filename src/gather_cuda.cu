/* gather_cuda.cu: the optional CUDA gather backend, built as a separately loaded module
 * (tpfs-cuda.so) so that the tpfs binary starts and works on machines with no CUDA runtime and no
 * GPU. The module links the CUDA runtime statically; the driver is found at run time.
 *
 * A gather copies, for each source its runs name (one for a rank file of one source file, or
 * several for a served file of pieces, in index order), the covering span of that source's runs
 * to the device in chunks (pinned staging buffers, two streams, so that the host copy of chunk
 * i+1 overlaps the transfer and the gather of chunk i), gathers every run's bytes with a kernel
 * into a device output buffer, and copies the result back; zero, header and constant runs are
 * filled on the host. One context serves all
 * the daemon's threads, one gather at a time (a mutex). Source bytes are read only through
 * tp_src_copy, the caller's SIGBUS guard: a source that fails under its mapping makes that copy
 * return -1 here, and the mutex is released on the way out like on any other error.
 *
 * Exported (C linkage): tp_cuda_probe (is a device usable? for the CLI, in a child process) and
 * tp_cuda_open (the backend, in the daemon after it forked).
 */
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "gather.h"
}

#define CHUNK (8u << 20) /* bytes of source per staging buffer */

struct drun {
	unsigned long long src; /* offset in the span */
	unsigned long long dst; /* offset in the output */
	unsigned long long len;
};

struct cuda_ctx {
	pthread_mutex_t mu;
	cudaStream_t st[2];
	unsigned char *pin[2], *dspan[2];
	unsigned char *dout, *pout;
	size_t out_cap;
	drun *hruns, *druns;
	size_t runs_cap;
	char name[256];
};

static int fail(tp_err *e, const char *what, cudaError_t err)
{
	if (e) {
		e->code = TP_EIO;
		snprintf(e->msg, sizeof e->msg, "CUDA gather: %s: %s", what, cudaGetErrorString(err));
	}
	return -1;
}

__global__ void gather_kernel(const drun *runs, size_t n, const unsigned char *chunk, unsigned long long cs,
			      unsigned long long cl, unsigned char *out)
{
	for (size_t i = blockIdx.x; i < n; i += gridDim.x) {
		drun r = runs[i];
		unsigned long long a = r.src > cs ? r.src : cs;
		unsigned long long b = r.src + r.len < cs + cl ? r.src + r.len : cs + cl;
		if (a >= b)
			continue;
		const unsigned char *s = chunk + (a - cs);
		unsigned char *d = out + r.dst + (a - r.src);
		unsigned long long len = b - a;
		if ((((unsigned long long)s | (unsigned long long)d) & 15) == 0) {
			unsigned long long n16 = len / 16;
			for (unsigned long long k = threadIdx.x; k < n16; k += blockDim.x)
				((uint4 *)d)[k] = ((const uint4 *)s)[k];
			for (unsigned long long k = n16 * 16 + threadIdx.x; k < len; k += blockDim.x)
				d[k] = s[k];
		} else {
			for (unsigned long long k = threadIdx.x; k < len; k += blockDim.x)
				d[k] = s[k];
		}
	}
}

static int grow(cuda_ctx *c, size_t out, size_t runs, tp_err *e)
{
	cudaError_t err;
	if (out > c->out_cap) {
		cudaFree(c->dout);
		cudaFreeHost(c->pout);
		c->dout = c->pout = NULL;
		c->out_cap = 0;
		if ((err = cudaMalloc(&c->dout, out)) != cudaSuccess || (err = cudaMallocHost(&c->pout, out)) != cudaSuccess)
			return fail(e, "allocating the output buffers", err);
		c->out_cap = out;
	}
	if (runs > c->runs_cap) {
		cudaFree(c->druns);
		cudaFreeHost(c->hruns);
		c->druns = c->hruns = NULL;
		c->runs_cap = 0;
		if ((err = cudaMalloc(&c->druns, runs * sizeof(drun))) != cudaSuccess ||
		    (err = cudaMallocHost(&c->hruns, runs * sizeof(drun))) != cudaSuccess)
			return fail(e, "allocating the run table", err);
		c->runs_cap = runs;
	}
	return 0;
}

/* Gathers the runs of source k (src[k]) into the device output: its covering span in chunks
 * through the staging buffers, the kernel placing each run at its offset in the output. */
static int gather_source(cuda_ctx *c, const tp_run *runs, size_t n, const tp_src *src, uint32_t k, tp_err *e)
{
	unsigned long long lo = ~0ull, hi = 0, out = 0;
	size_t ns = 0;
	for (size_t i = 0; i < n; i++) {
		if (runs[i].kind == TP_RUN_SRC && runs[i].src == k) {
			lo = runs[i].off < lo ? runs[i].off : lo;
			hi = runs[i].off + runs[i].len > hi ? runs[i].off + runs[i].len : hi;
		}
	}
	for (size_t i = 0; i < n; i++) {
		if (runs[i].kind == TP_RUN_SRC && runs[i].src == k)
			c->hruns[ns++] = drun{runs[i].off - lo, out, runs[i].len};
		out += runs[i].len;
	}
	cudaError_t err;
	if ((err = cudaMemcpyAsync(c->druns, c->hruns, ns * sizeof(drun), cudaMemcpyHostToDevice, c->st[0])) != cudaSuccess)
		return fail(e, "copying the run table", err);
	if ((err = cudaStreamSynchronize(c->st[0])) != cudaSuccess)
		return fail(e, "copying the run table", err);
	int b = 0;
	for (unsigned long long cs = lo; cs < hi; cs += CHUNK, b ^= 1) {
		unsigned long long cl = hi - cs < CHUNK ? hi - cs : CHUNK;
		if ((err = cudaStreamSynchronize(c->st[b])) != cudaSuccess) /* staging buffer b is free again */
			return fail(e, "waiting for a stream", err);
		if (tp_src_copy(&src[k], c->pin[b], cs, cl) < 0) {
			/* the source failed under its mapping (the guard caught a SIGBUS inside this
			 * copy only): let the streams finish with the staging buffers, then return;
			 * cuda_gather releases the lock as on any error */
			for (int s2 = 0; s2 < 2; s2++)
				cudaStreamSynchronize(c->st[s2]);
			e->code = TP_ECHANGED;
			snprintf(e->msg, sizeof e->msg, "the source could not be read under its mapping at %llu (SIGBUS caught)",
				 cs);
			return -1;
		}
		if ((err = cudaMemcpyAsync(c->dspan[b], c->pin[b], cl, cudaMemcpyHostToDevice, c->st[b])) != cudaSuccess)
			return fail(e, "copying the source span", err);
		unsigned blocks = ns < 4096 ? (unsigned)ns : 4096;
		gather_kernel<<<blocks, 256, 0, c->st[b]>>>(c->druns, ns, c->dspan[b], cs - lo, cl, c->dout);
		if ((err = cudaGetLastError()) != cudaSuccess)
			return fail(e, "launching the gather", err);
	}
	for (int s = 0; s < 2; s++) /* the run table and the staging buffers are free for the next source */
		if ((err = cudaStreamSynchronize(c->st[s])) != cudaSuccess)
			return fail(e, "gathering", err);
	return 0;
}

static int do_gather(cuda_ctx *c, const tp_run *runs, size_t n, const tp_src *src, const uint8_t *hdr, uint8_t *dst,
		     tp_err *e)
{
	unsigned long long total = 0;
	size_t ns = 0;
	uint32_t first = UINT32_MAX; /* the lowest source index the runs name */
	for (size_t i = 0; i < n; i++) {
		total += runs[i].len;
		if (runs[i].kind == TP_RUN_WIDEN || runs[i].kind == TP_RUN_TRANSPOSE) { /* the CPU gather's alone */
			e->code = TP_EINVAL;
			snprintf(e->msg, sizeof e->msg, "the CUDA gather neither widens nor transposes (run %zu)", i);
			return -1;
		}
		if (runs[i].kind != TP_RUN_SRC)
			continue;
		ns++;
		const tp_src *s = &src[runs[i].src];
		first = runs[i].src < first ? runs[i].src : first;
		if (runs[i].off + runs[i].len > s->size) {
			e->code = TP_ECHANGED;
			snprintf(e->msg, sizeof e->msg, "run past the planned source size");
			return -1;
		}
		if (!s->map) {
			e->code = TP_EIO;
			snprintf(e->msg, sizeof e->msg, "CUDA gather needs a mapped source");
			return -1;
		}
	}
	if (grow(c, total ? total : 1, ns ? ns : 1, e) < 0)
		return -1;
	cudaError_t err;
	if (ns) {
		/* one source at a time, in index order (a rank file of one source: one pass) */
		for (uint32_t k = first; k != UINT32_MAX;) {
			if (gather_source(c, runs, n, src, k, e) < 0)
				return -1;
			uint32_t next = UINT32_MAX;
			for (size_t i = 0; i < n; i++)
				if (runs[i].kind == TP_RUN_SRC && runs[i].src > k && runs[i].src < next)
					next = runs[i].src;
			k = next;
		}
		if ((err = cudaMemcpy(c->pout, c->dout, total, cudaMemcpyDeviceToHost)) != cudaSuccess)
			return fail(e, "copying the result back", err);
	}
	unsigned long long out = 0;
	for (size_t i = 0; i < n; i++) {
		if (runs[i].kind == TP_RUN_SRC)
			memcpy(dst + out, c->pout + out, runs[i].len);
		else if (runs[i].kind == TP_RUN_ZERO)
			memset(dst + out, 0, runs[i].len);
		else /* header and constant runs */
			memcpy(dst + out, hdr + runs[i].off, runs[i].len);
		out += runs[i].len;
	}
	return 0;
}

static int cuda_gather(void *self, const tp_run *runs, size_t n, const tp_src *src, const uint8_t *hdr, uint8_t *dst,
		       tp_err *e)
{
	cuda_ctx *c = (cuda_ctx *)self;
	pthread_mutex_lock(&c->mu);
	int rc = do_gather(c, runs, n, src, hdr, dst, e);
	pthread_mutex_unlock(&c->mu);
	return rc;
}

static void cuda_destroy(void *self)
{
	cuda_ctx *c = (cuda_ctx *)self;
	if (!c)
		return;
	for (int i = 0; i < 2; i++) {
		cudaFreeHost(c->pin[i]);
		cudaFree(c->dspan[i]);
		if (c->st[i])
			cudaStreamDestroy(c->st[i]);
	}
	cudaFree(c->dout);
	cudaFreeHost(c->pout);
	cudaFree(c->druns);
	cudaFreeHost(c->hruns);
	pthread_mutex_destroy(&c->mu);
	free(c);
}

static const tp_gather_ops cuda_ops = {"cuda", cuda_gather, cuda_destroy};

/* The run layout this module reads (run.h TP_RUN_ABI), checked by the loader. */
extern "C" {
extern const unsigned tp_cuda_abi;
const unsigned tp_cuda_abi = TP_RUN_ABI;
}

extern "C" int tp_cuda_probe(char *why, size_t n)
{
	int count = 0;
	cudaError_t err = cudaGetDeviceCount(&count);
	if (err != cudaSuccess) {
		snprintf(why, n, "no usable CUDA device (%s)", cudaGetErrorString(err));
		return -1;
	}
	if (count < 1) {
		snprintf(why, n, "no CUDA device");
		return -1;
	}
	cudaDeviceProp p;
	if (cudaGetDeviceProperties(&p, 0) == cudaSuccess)
		snprintf(why, n, "%s (%d device%s)", p.name, count, count == 1 ? "" : "s");
	return 0;
}

extern "C" int tp_cuda_open(tp_gather *out, char *why, size_t n)
{
	if (tp_cuda_probe(why, n) < 0)
		return -1;
	cuda_ctx *c = (cuda_ctx *)calloc(1, sizeof *c);
	if (!c) {
		snprintf(why, n, "out of memory");
		return -1;
	}
	pthread_mutex_init(&c->mu, NULL);
	snprintf(c->name, sizeof c->name, "%s", why);
	cudaError_t err = cudaSetDevice(0);
	for (int i = 0; i < 2 && err == cudaSuccess; i++) {
		err = cudaStreamCreateWithFlags(&c->st[i], cudaStreamNonBlocking);
		if (err == cudaSuccess)
			err = cudaMallocHost(&c->pin[i], CHUNK);
		if (err == cudaSuccess)
			err = cudaMalloc(&c->dspan[i], CHUNK);
	}
	if (err != cudaSuccess) {
		snprintf(why, n, "CUDA setup failed: %s", cudaGetErrorString(err));
		cuda_destroy(c);
		return -1;
	}
	out->ops = &cuda_ops;
	out->self = c;
	return 0;
}
