/* fs_resid.c: what the daemon holds of its sources and for its replies, apart from the read path that
 * uses it (fs_read.c): which source pages a read asks the kernel for, ahead of the copy, and which it
 * releases from the daemon's page table behind it; the access advice of the source mappings; and each
 * worker thread's scratch buffer. The policy in brief: no kernel readahead on the sources (it would read
 * other ranks' rows); a read asks for exactly its runs' source pages and the next PF_AHEAD bytes' with
 * MADV_WILLNEED, skipping pages a recent check found cached; after the copy the daemon drops its page-table
 * entries of those pages (they stay in the page cache), so its RSS stays flat. Nothing here changes a byte
 * a read returns: a prefetch that races or is dropped only costs a fault later. Also the push's direct
 * reads (--push-io, at the end): the source pages of a push's pass that are not cached, read with
 * O_DIRECT into the push thread's buffer instead of through the page cache and the mapping.
 */
#include "fs_int.h"

/* Drops this process's page-table entries of the pages of source src behind runs (they stay in
 * the page cache): without it, every source page a reply touched would count in the daemon's
 * RSS, a 700 GB checkpoint read once would show as 700 GB resident. */
static void release_runs_src(const tp_fs *fs, const tp_node *n, const tp_run *runs, size_t nr, uint32_t src)
{
	if (!fs->o->release_pages || !n->map)
		return;
	uint64_t lo = UINT64_MAX, hi = 0;
	for (size_t k = 0; k < nr; k++) {
		if (!tp_run_reads(&runs[k]) || runs[k].src != src)
			continue;
		uint64_t a, end;
		tp_run_src_span(&runs[k], &a, &end);
		lo = a < lo ? a : lo;
		hi = end > hi ? end : hi;
	}
	if (lo >= hi)
		return;
	/* The kernel maps more than the pages a copy touches: fault-around maps the neighbours of a
	 * faulting page (64 KiB by default) and a large folio is mapped whole. Release a 2 MiB-aligned
	 * span around the runs so those neighbours go too (another thread needing them faults again). */
	const uint64_t align = 2u << 20;
	static uint64_t page;
	if (!page)
		page = (uint64_t)sysconf(_SC_PAGESIZE);
	uint64_t a = lo / align * align, b = (hi + align - 1) / align * align;
	uint64_t end = (n->src_size + page - 1) / page * page;
	if (b > end)
		b = end;
	if (a < b)
		madvise((void *)(n->map + a), b - a, MADV_DONTNEED);
}

/* ---- fetching source pages (issue 16: a node reads only what its ranks need) ----
 *
 * The source mappings get no readahead (MADV_RANDOM, set at mount): the kernel's readahead
 * around a fault reads megabytes of neighbouring rows that belong to other ranks. Instead, each
 * read asks for exactly the source pages of its own runs (when no earlier read asked for them)
 * and of the next PF_AHEAD bytes of the rank file, coalesced into page ranges, with
 * MADV_WILLNEED: the kernel starts that I/O and returns. Pages already cached are skipped after
 * one mincore() per window of at most PF_SPAN of source, and a 1 MiB chunk found wholly cached is
 * not checked again for a second, so a cached source costs a few system calls per read. */

static uint64_t sys_page(void)
{
	static uint64_t page;
	if (!page)
		page = (uint64_t)sysconf(_SC_PAGESIZE);
	return page;
}

/* A millisecond clock for residency marks (wraps; never 0). */
static uint32_t now_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC_COARSE, &t);
	uint32_t v = (uint32_t)((uint64_t)t.tv_sec * 1000u + (uint64_t)t.tv_nsec / 1000000u);
	return v ? v : 1;
}

/* Asks the kernel to start reading the pages of ranges rg[0..ng) that are not in the page cache:
 * one mincore() per window of up to PF_SPAN of source (whole RC_CHUNKs, up to the last range in
 * it), then MADV_WILLNEED on each stretch of missing pages, in pieces of at most WN_CHUNK (the
 * kernel reads at most max(io_pages, ra_pages) pages per call and silently drops the rest of a
 * larger one). A chunk that a check found wholly cached, or that a range of this call covered
 * whole (every missing page of it asked for), in the last RC_FRESH_MS is skipped (resid, NULL: no
 * marks): with a cached source the checks were a fifth of the daemon's time at T=8, every rank
 * checking the pages around its own; from slow storage mincore() reports the pages still being
 * read as missing (it counts only up-to-date pages), so without the asked mark every read asked
 * again for the whole window ahead, which is in flight all the time there: 20 GB of mincore()
 * and MADV_WILLNEED for a 1 GB file, 3.5 s of the daemon's system time (bench/vllm_nodes.py).
 * A page evicted, or a read-ahead the kernel dropped, within that time is read when the copy
 * touches it, as without prefetch. */
static void fetch_ranges(const tp_node *n, _Atomic uint32_t *resid, const tp_io_range *rg, size_t ng)
{
	const uint64_t page = sys_page(), end = (n->src_size + page - 1) / page * page;
	unsigned char vec[PF_SPAN / 4096];
	uint64_t wlo = 0, whi = 0;
	int known = 0;
	const uint32_t now = resid ? now_ms() : 0;
	for (size_t j = 0; j < ng; j++) {
		uint64_t x = rg[j].lo, hi = rg[j].hi < end ? rg[j].hi : end;
		while (x < hi) {
			if (resid) {
				uint64_t c = x / RC_CHUNK;
				uint32_t st = atomic_load_explicit(&resid[c], memory_order_relaxed);
				if (st && now - st <= RC_FRESH_MS) {
					x = (c + 1) * RC_CHUNK < hi ? (c + 1) * RC_CHUNK : hi;
					continue;
				}
			}
			if (x < wlo || x >= whi) { /* a new residency window, up to the last range in it */
				wlo = resid ? x / RC_CHUNK * RC_CHUNK : x;
				whi = end - wlo > sizeof vec * page ? wlo + sizeof vec * page : end;
				uint64_t need = hi;
				for (size_t k = j + 1; k < ng && rg[k].lo < whi; k++)
					need = rg[k].hi > need ? rg[k].hi : need;
				if (resid) /* whole chunks, so that each can be marked */
					need = (need + RC_CHUNK - 1) / RC_CHUNK * RC_CHUNK;
				whi = need < whi ? (need + page - 1) / page * page : whi;
				known = page >= 4096 && mincore((void *)(n->map + wlo), whi - wlo, vec) == 0;
				for (uint64_t c = wlo; known && resid && c < whi; c += RC_CHUNK) {
					uint64_t ce = c + RC_CHUNK < whi ? c + RC_CHUNK : whi, p = c;
					while (p < ce && (vec[(p - wlo) / page] & 1))
						p += page;
					if (p == ce && (ce - c == RC_CHUNK || ce == end))
						atomic_store_explicit(&resid[c / RC_CHUNK], now, memory_order_relaxed);
				}
			}
			uint64_t stop = hi < whi ? hi : whi;
			while (known && x < stop && (vec[(x - wlo) / page] & 1))
				x += page;
			uint64_t y = x;
			while (y < stop && y - x < WN_CHUNK && !(known && (vec[(y - wlo) / page] & 1)))
				y += page;
			if (y > x)
				madvise((void *)(n->map + x), y - x, MADV_WILLNEED);
			x = y;
		}
		if (resid) { /* every chunk the range covers whole is asked for now */
			uint64_t c = (rg[j].lo + RC_CHUNK - 1) / RC_CHUNK, ce = hi == end ? (hi + RC_CHUNK - 1) / RC_CHUNK : hi / RC_CHUNK;
			for (; c < ce; c++)
				atomic_store_explicit(&resid[c], now, memory_order_relaxed);
		}
	}
}

/* Sets the access advice of every source mapping once, before serving (see above). */
void advise_sources(const tp_fs *fs)
{
	for (uint32_t i = 0; i < fs->nn; i++) {
		const tp_node *n = &fs->m->tree.n[i];
		if (n->kind == TN_TENSORS && n->map && fs->o->source_io != 1 &&
		    madvise((void *)n->map, n->src_size, MADV_RANDOM) < 0)
			tp_log(0, "%s: cannot turn off readahead on the source (%s): a node may read more than its ranks need",
			       n->path, strerror(errno));
	}
}

/* fetch_ranges for ranges of the file's sources (each names its source; runs of one source
 * are consecutive, as the planners give them). */
static void fetch_src(const tp_fs *fs, const rfile *rf, const tp_io_range *rg, size_t ng)
{
	for (size_t a = 0, b; a < ng; a = b) {
		for (b = a + 1; b < ng && rg[b].src == rg[a].src; b++)
			;
		uint32_t node = rf->node[rg[a].src];
		if (fs->m->tree.n[node].map)
			fetch_ranges(&fs->m->tree.n[node], fs->ns[node].resid, rg + a, b - a);
	}
}

/* The source pages of runs (as tp_file_map gives them). */
static void fetch_runs(const tp_fs *fs, const rfile *rf, const tp_run *runs, size_t nr)
{
	tp_io_range rg[64];
	tp_io_at at = {0, 0};
	while (at.run < nr) {
		tp_io_at was = at;
		size_t ng = tp_io_ranges_src(runs, nr, sys_page(), rg, 64, &at);
		fetch_src(fs, rf, rg, ng);
		if (at.run == was.run && at.cut <= was.cut)
			break; /* no progress (not reached: each call advances) */
	}
}

/* The source pages of file bytes [a, b): those tp_file_io_plan gives, without visiting every row
 * of a tensor whose rows' pages run into each other. */
static void fetch_span(const tp_fs *fs, const rfile *rf, uint64_t a, uint64_t b)
{
	tp_io_range rg[64];
	uint64_t cut = 0;
	while (a < b) {
		uint64_t cov, was = cut;
		size_t ng = tp_file_io_plan(rf->f, a, b, sys_page(), rg, 64, &cov, &cut);
		fetch_src(fs, rf, rg, ng);
		if (!cov && cut <= was)
			break; /* no progress (not reached: each call advances) */
		a += cov;
	}
}

/* Before replying to a read of [off, off + want) of the file (whose first pass of runs is
 * runs[0..nr), covering cov bytes): fetches its own pages unless an earlier read of this window
 * did, and the next PF_AHEAD bytes' pages that no read has asked for yet, except while the push
 * reads the source with O_DIRECT (fs->push_reading): it fetches those pages itself, into no page
 * cache, so a read's fetch ahead would fetch them a second time (bench/vllm_nodes.py saw each
 * node fetch 1.5x its page-touch minimum from the safetensors headers vLLM reads as it starts,
 * 8 MiB ahead of each). The window is advisory: a race between threads only repeats or skips a
 * prefetch, never changes bytes. */
void fetch_ahead(const tp_fs *fs, const rfile *rf, uint64_t off, uint64_t want, const tp_run *runs, size_t nr,
		 uint64_t cov)
{
	if (fs->o->source_io != 0)
		return;
	uint64_t size = tp_file_size(rf->f), end = off + want, w = atomic_load_explicit(rf->win, memory_order_relaxed);
	uint64_t lo = (w >> 32) * PF_UNIT, hi = (w & 0xffffffffu) * PF_UNIT;
	int inside = off >= lo && end <= hi;
	if (!inside) {
		if (cov == want)
			fetch_runs(fs, rf, runs, nr);
		else
			fetch_span(fs, rf, off, end);
	}
	uint64_t from = inside ? hi : end, to = size - end > PF_AHEAD ? end + PF_AHEAD : size;
	if (from >= to || atomic_load_explicit(&fs->push_reading, memory_order_relaxed))
		return;
	uint64_t nlo = (inside ? lo : off) / PF_UNIT, nhi = to == size ? (to + PF_UNIT - 1) / PF_UNIT : to / PF_UNIT;
	if (nhi <= 0xffffffffu && !atomic_compare_exchange_strong_explicit(rf->win, &w, nlo << 32 | nhi,
									    memory_order_relaxed, memory_order_relaxed))
		return; /* another thread moved the window and fetches ahead of it */
	fetch_span(fs, rf, from, to);
}

/* After a reply: every source's pages the reply's runs touched leave this process's page table,
 * and pages cached by a reply that raced a change are dropped again. */
void release_after(tp_fs *fs, const rfile *rf, const tp_run *runs, size_t nr)
{
	for (uint32_t k = 0; k < rf->nsrc; k++)
		release_runs_src(fs, &fs->m->tree.n[rf->node[k]], runs, nr, k);
}

/* The reply buffer of each libfuse worker thread (readdir and reads), grown as needed. */
static pthread_key_t scratch_key;

static void scratch_free(void *p)
{
	scratch *s = p;
	if (s) {
		free(s->buf);
		free(s);
	}
}

scratch *get_scratch(size_t need)
{
	scratch *s = pthread_getspecific(scratch_key);
	if (!s) {
		s = calloc(1, sizeof *s);
		if (!s)
			return NULL;
		pthread_setspecific(scratch_key, s);
	}
	if (s->cap < need || !s->buf) { /* always a buffer, even for a zero-length need */
		size_t cap = need < (1u << 20) + 4096 ? (1u << 20) + 4096 : need;
		uint8_t *b = realloc(s->buf, cap);
		if (!b)
			return NULL;
		s->buf = b;
		s->cap = cap;
	}
	return s;
}

void scratch_key_make(void)
{
	pthread_key_create(&scratch_key, scratch_free);
}

/* ---- the push's direct source reads (--push-io direct; issue 46, item 2) ----
 *
 * From a cold source, the mapping path costs per 4 KiB page on the daemon's side: MADV_WILLNEED fills
 * the source's page cache a folio at a time (allocation, memcg charge, LRU), mincore checks it, the
 * copy faults the pages into the mapping and the release drops them again (docs/PERFORMANCE.md: "The
 * cold push's CPU"). The push knows every run of a pass before it copies: the runs' source pages,
 * coalesced per source into page ranges, that are not all cached are read with O_DIRECT (up to
 * STAGE_QD in flight, through Linux AIO where io_setup allows, else one pread at a time) into the push
 * thread's buffer, and those runs gathered from there; resident ranges stay on the mapping. The bytes
 * are those of the source file as O_DIRECT reads it (dirty cached pages are written back first), and
 * the caller's identity checks before and after the copy hold as for the mapping: a write moves the
 * file's mtime before it changes a byte. Each source gets a second descriptor, reopened through
 * /proc/self/fd (the same inode: checked) so no path is resolved again. */

#include <linux/aio_abi.h>

int stage_init(push_stage *ps, uint32_t nn)
{
	memset(ps, 0, sizeof *ps);
	ps->nn = nn;
	ps->dfd = malloc((nn + 1) * sizeof *ps->dfd);
	ps->rg = malloc(RUN_CAP * sizeof *ps->rg);
	ps->of = malloc(RUN_CAP * sizeof *ps->of);
	ps->vec = malloc(STAGE_SPAN / sys_page() + 1);
	ps->tail = malloc(sys_page());
	if (!ps->dfd || !ps->rg || !ps->of || !ps->vec || !ps->tail) {
		stage_free(ps);
		return -1;
	}
	for (uint32_t i = 0; i < nn; i++)
		ps->dfd[i] = -1;
	aio_context_t ctx = 0;
	if (syscall(SYS_io_setup, STAGE_QD, &ctx) == 0)
		ps->aio = (unsigned long)ctx;
	return 0;
}

void stage_free(push_stage *ps)
{
	for (uint32_t i = 0; ps->dfd && i < ps->nn; i++)
		if (ps->dfd[i] >= 0)
			close(ps->dfd[i]);
	if (ps->aio)
		syscall(SYS_io_destroy, (aio_context_t)ps->aio);
	free(ps->dfd);
	free(ps->rg);
	free(ps->of);
	free(ps->vec);
	free(ps->tail);
	free(ps->tab);
	free(ps->buf);
	memset(ps, 0, sizeof *ps);
}

/* The O_DIRECT descriptor of node i's source (opened on first use), or -1 where there is none. */
static int direct_fd(const tp_fs *fs, push_stage *ps, uint32_t i)
{
	if (ps->dfd[i] != -1)
		return ps->dfd[i] >= 0 ? ps->dfd[i] : -1;
	const tp_node *n = &fs->m->tree.n[i];
	char p[64];
	int d = -1;
	struct stat a, b;
	if (n->fd >= 0 && n->map && snprintf(p, sizeof p, "/proc/self/fd/%d", n->fd) < (int)sizeof p)
		d = open(p, O_RDONLY | O_DIRECT | O_CLOEXEC);
	if (d >= 0 && (fstat(d, &a) || fstat(n->fd, &b) || a.st_dev != b.st_dev || a.st_ino != b.st_ino)) {
		close(d); /* not the file mapped (not reached: the link names the open file) */
		d = -1;
	}
	ps->dfd[i] = d >= 0 ? d : -2;
	return d;
}

/* Node i's direct reads failed with EINVAL (O_DIRECT refused by its file system or device): its
 * pushes map from now on. */
static void no_direct(push_stage *ps, uint32_t i)
{
	if (ps->dfd[i] >= 0)
		close(ps->dfd[i]);
	ps->dfd[i] = -2;
}

/* Reads ranges rg[0..ng) marked direct into ps->buf: 0; 1 where a source refused O_DIRECT (EINVAL:
 * nothing may be used, the pass maps); EIO (a failed read, noted); ESTALE (a source ended early).
 * *got: bytes read. */
static int read_ranges(const tp_fs *fs, push_stage *ps, const rfile *rf, size_t ng, uint64_t *got)
{
	uint64_t done[STAGE_QD];
	*got = 0;
	for (size_t a = 0; a < ng;) {
		size_t idx[STAGE_QD], q = 0, b = a;
		for (; b < ng && q < STAGE_QD; b++)
			if (ps->rg[b].direct)
				idx[q++] = b;
		for (size_t j = 0; j < q; j++)
			done[j] = ps->rg[idx[j]].skip;
		if (ps->aio && q > 1) { /* all of them in flight at once; what is short or left is read below (a
					  * range wholly in the tail is submitted for nothing: q counts it, nbytes 0) */
			struct iocb cb[STAGE_QD], *cbp[STAGE_QD];
			for (size_t j = 0; j < q; j++) {
				const stage_rg *g = &ps->rg[idx[j]];
				memset(&cb[j], 0, sizeof cb[j]);
				cb[j].aio_data = j;
				cb[j].aio_lio_opcode = IOCB_CMD_PREAD;
				cb[j].aio_fildes = (uint32_t)ps->dfd[rf->node[g->src]];
				cb[j].aio_buf = (uint64_t)(uintptr_t)(ps->buf + g->pos + g->skip);
				cb[j].aio_nbytes = g->hi - g->lo - g->skip;
				cb[j].aio_offset = (int64_t)(g->lo + g->skip);
				cbp[j] = &cb[j];
			}
			long sub = syscall(SYS_io_submit, (aio_context_t)ps->aio, (long)q, cbp);
			sub = sub < 0 ? 0 : sub;
			struct io_event ev[STAGE_QD];
			for (long left = sub; left > 0;) {
				long k = syscall(SYS_io_getevents, (aio_context_t)ps->aio, 1L, left, ev, NULL);
				if (k < 0 && errno == EINTR)
					continue;
				if (k <= 0) { /* not reached; the context is unusable: no more AIO (pending reads end with it) */
					syscall(SYS_io_destroy, (aio_context_t)ps->aio);
					ps->aio = 0;
					return 1;
				}
				for (long e = 0; e < k; e++)
					if (ev[e].res > 0)
						done[ev[e].data] += (uint64_t)ev[e].res;
					else if (ev[e].res == -EINVAL) {
						no_direct(ps, rf->node[ps->rg[idx[ev[e].data]].src]);
						done[ev[e].data] = UINT64_MAX;
					}
				left -= k;
			}
			for (size_t j = 0; j < q; j++)
				if (done[j] == UINT64_MAX)
					return 1;
		}
		for (size_t j = 0; j < q; j++) { /* one at a time: without AIO, and to finish short reads */
			const stage_rg *g = &ps->rg[idx[j]];
			uint32_t node = rf->node[g->src];
			while (done[j] < g->need) {
				if (done[j] % sys_page())
					return ESTALE; /* a read ended mid-page: the file ends there, before the runs' bytes */
				ssize_t r = pread(ps->dfd[node], ps->buf + g->pos + done[j], g->hi - g->lo - done[j],
						  (off_t)(g->lo + done[j]));
				if (r < 0 && errno == EINTR)
					continue;
				if (r < 0 && errno == EINVAL && !done[j]) {
					no_direct(ps, node);
					return 1;
				}
				if (r < 0) {
					note_failure(fs->m->tree.n[node].path, "reading the source failed (%s): that read failed with EIO",
						     strerror(errno));
					tp_log(2, "%s: direct read at %llu failed: %s", fs->m->tree.n[node].path,
					       (unsigned long long)(g->lo + done[j]), strerror(errno));
					return EIO;
				}
				if (r == 0)
					return ESTALE;
				done[j] += (uint64_t)r;
			}
			ps->rg[idx[j]].got = done[j];
			*got += done[j] - g->skip;
		}
		a = b;
	}
	return 0;
}

int stage_cold(tp_fs *fs, push_stage *ps, const rfile *rf, tp_run *runs, size_t nr, const tp_src **tab, uint32_t *ntab,
	       uint64_t *direct)
{
	const uint64_t page = sys_page();
	*tab = rf->tab;
	*ntab = rf->nsrc;
	*direct = 0;
	size_t ng = 0;
	for (size_t k = 0; k < nr; k++) { /* the runs' source pages, coalesced per source */
		ps->of[k] = UINT32_MAX;
		if (!tp_run_reads(&runs[k]) || !runs[k].len)
			continue;
		const uint32_t s = runs[k].src;
		const tp_src *t = &rf->tab[s];
		uint64_t a, b;
		tp_run_src_span(&runs[k], &a, &b);
		if (s >= rf->nsrc || !t->map || b > t->size || a >= b || direct_fd(fs, ps, rf->node[s]) < 0)
			continue; /* stays on the mapping (the gather reports a run past the source) */
		uint64_t lo = a / page * page, hi = (b + page - 1) / page * page;
		stage_rg *g = ng ? &ps->rg[ng - 1] : NULL;
		if (g && g->src == s && lo >= g->lo && lo <= g->hi) {
			g->hi = hi > g->hi ? hi : g->hi;
			g->need = b - g->lo > g->need ? b - g->lo : g->need;
		} else {
			g = &ps->rg[ng++];
			*g = (stage_rg){.lo = lo, .hi = hi, .need = b - lo, .src = s};
		}
		ps->of[k] = (uint32_t)(g - ps->rg);
	}
	/* which ranges are cold: one mincore per window of up to STAGE_SPAN of a source */
	uint64_t wlo = 0, whi = 0, total = 0;
	uint32_t wsrc = UINT32_MAX;
	for (size_t j = 0; j < ng; j++) {
		stage_rg *g = &ps->rg[j];
		const tp_node *n = &fs->m->tree.n[rf->node[g->src]];
		const uint64_t end = (n->src_size + page - 1) / page * page, hi = g->hi < end ? g->hi : end;
		if (hi - g->lo > STAGE_SPAN || total + (g->hi - g->lo) > STAGE_MAX)
			continue; /* maps */
		if (g->src != wsrc || g->lo < wlo || hi > whi) {
			wsrc = g->src;
			wlo = g->lo;
			whi = hi;
			for (size_t k = j + 1; k < ng && ps->rg[k].src == g->src && ps->rg[k].lo >= wlo; k++) {
				uint64_t h = ps->rg[k].hi < end ? ps->rg[k].hi : end;
				if (h - wlo > STAGE_SPAN)
					break;
				whi = h > whi ? h : whi;
			}
			if (mincore((void *)(n->map + wlo), whi - wlo, ps->vec) != 0)
				memset(ps->vec, 0, (whi - wlo) / page); /* unknown: read it */
		}
		uint64_t p = g->lo;
		while (p < hi && (ps->vec[(p - wlo) / page] & 1))
			p += page;
		if (p < hi) { /* a page of it is not cached */
			g->direct = 1;
			g->pos = total;
			total += g->hi - g->lo;
			/* the previous pass's last page, where a run crossed the chunk's end: copied, not read again */
			g->skip = ps->tail_ok && ps->tail_node == rf->node[g->src] && ps->tail_off == g->lo ? page : 0;
		}
	}
	if (!total)
		return 0;
	if (ps->tabcap < rf->nsrc + 1) {
		tp_src *t = realloc(ps->tab, (rf->nsrc + 1) * sizeof *t);
		if (!t)
			return 0; /* maps */
		ps->tab = t;
		ps->tabcap = rf->nsrc + 1;
	}
	if (ps->cap < total) {
		size_t cap = (total + (1u << 20) - 1) / (1u << 20) * (1u << 20);
		void *b = NULL;
		if (posix_memalign(&b, 4096, cap) != 0)
			return 0; /* maps */
		free(ps->buf);
		ps->buf = b;
		ps->cap = cap;
	}
	for (size_t j = 0; j < ng; j++)
		if (ps->rg[j].direct && ps->rg[j].skip)
			memcpy(ps->buf + ps->rg[j].pos, ps->tail, page);
	ps->tail_ok = 0; /* kept below only when this pass's reads all succeed */
	uint64_t got;
	int rc = read_ranges(fs, ps, rf, ng, &got);
	if (rc == 1)
		return 0; /* O_DIRECT refused: the pass maps, runs as they were */
	if (rc)
		return rc;
	for (size_t k = 0; k < nr; k++) {
		if (ps->of[k] == UINT32_MAX || !ps->rg[ps->of[k]].direct)
			continue;
		const stage_rg *g = &ps->rg[ps->of[k]];
		runs[k].off = runs[k].off - g->lo + g->pos;
		runs[k].src = rf->nsrc;
	}
	for (size_t j = ng; j-- > 0;) /* the last page this pass read, for the next (the sources' identity checks,
				       * before and after each pass, hold for it as for any byte read) */
		if (ps->rg[j].direct) {
			const stage_rg *g = &ps->rg[j];
			const tp_node *n = &fs->m->tree.n[rf->node[g->src]];
			if (g->hi <= n->src_size && g->got == g->hi - g->lo) { /* a whole page, read in full */
				memcpy(ps->tail, ps->buf + g->pos + (g->hi - page - g->lo), page);
				ps->tail_node = rf->node[g->src];
				ps->tail_off = g->hi - page;
				ps->tail_ok = 1;
			}
			break;
		}
	memcpy(ps->tab, rf->tab, rf->nsrc * sizeof *ps->tab);
	ps->tab[rf->nsrc] = (tp_src){.fd = -1, .map = ps->buf, .size = total};
	*tab = ps->tab;
	*ntab = rf->nsrc + 1;
	*direct = got;
	return 0;
}
