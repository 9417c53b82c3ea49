/* fs_read.c: the read path: open, read and release of every file of a mount.
 *
 * A read of a rank's tensor file is one pass (read_tensors): decode the inode, check that the
 * source has not changed (the watcher's mark, one fstat), map the request to runs once (tp_map),
 * ask for the source pages of those runs and of the next PF_AHEAD bytes (no kernel readahead on
 * the sources: fetching below), copy the runs into a per-thread buffer (the chosen gather
 * backend; only its copies of source bytes run under the SIGBUS guard), check the source again,
 * and reply. Replies without source bytes (header, padding) are iovecs into the header and a
 * zero page. Plain files are opened for each read (read_plain), so an open file costs the daemon
 * no descriptor. No request allocates beyond its thread's scratch, parses, or looks up a name.
 */
#include "fs_int.h"

static const uint8_t zero_page[1 << 20];

void fh_free(fhandle *h)
{
	free(h->buf);
	free(h);
}

/* Puts h on the list of open handles (so that teardown frees what no RELEASE reached). */
static void fh_track(struct tp_fs *fs, fhandle *h);
/* Takes h off that list and frees it. */
static void fh_release(struct tp_fs *fs, fhandle *h);

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
		uint64_t end = runs[k].off + tp_run_src_bytes(&runs[k]);
		lo = runs[k].off < lo ? runs[k].off : lo;
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

/* release_runs_src for a layout's runs (one source). */
static void release_runs(const tp_fs *fs, const tp_node *n, const tp_run *runs, size_t nr)
{
	release_runs_src(fs, n, runs, nr, 0);
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
 * larger one). A chunk that a check found wholly cached in the last RC_FRESH_MS is skipped
 * (resid, NULL: no marks): with a cached source the checks were a fifth of the daemon's time at
 * T=8, every rank checking the pages around its own. A page evicted within that time is read
 * when the copy touches it, as without prefetch. */
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
	}
}

/* fetch_ranges for the pages of runs (as tp_map gives them). */
static void fetch_runs(const tp_node *n, _Atomic uint32_t *resid, const tp_run *runs, size_t nr)
{
	tp_io_range rg[64];
	size_t done = 0;
	while (done < nr) {
		size_t used, ng = tp_io_ranges(runs + done, nr - done, sys_page(), rg, 64, &used);
		fetch_ranges(n, resid, rg, ng);
		if (!used)
			break;
		done += used;
	}
}

/* fetch_ranges for rank-file bytes [a, b): the pages tp_io_plan gives, without visiting every
 * row of a tensor whose rows' pages run into each other. */
static void fetch_range(const tp_node *n, _Atomic uint32_t *resid, const tp_layout *L, uint64_t a, uint64_t b)
{
	tp_io_range rg[64];
	while (a < b) {
		uint64_t cov;
		size_t ng = tp_io_plan(L, a, b, sys_page(), rg, 64, &cov);
		fetch_ranges(n, resid, rg, ng);
		if (!cov)
			break;
		a += cov;
	}
}

/* Before replying to a read of [off, off + want) of rank file L (whose first pass of runs is
 * runs[0..nr), covering cov bytes): fetches its own pages unless an earlier read of this window
 * did, and the next PF_AHEAD bytes' pages that no read has asked for yet. The window is advisory:
 * a race between threads only repeats or skips a prefetch, never changes bytes. */
static void prefetch(const tp_fs *fs, const tp_node *n, _Atomic uint32_t *resid, const tp_layout *L,
		     _Atomic uint64_t *win, uint64_t off, uint64_t want, const tp_run *runs, size_t nr, uint64_t cov)
{
	if (fs->o->source_io != 0 || !n->map)
		return;
	uint64_t end = off + want, w = atomic_load_explicit(win, memory_order_relaxed);
	uint64_t lo = (w >> 32) * PF_UNIT, hi = (w & 0xffffffffu) * PF_UNIT;
	int inside = off >= lo && end <= hi;
	if (!inside) {
		if (cov == want)
			fetch_runs(n, resid, runs, nr);
		else
			fetch_range(n, resid, L, off, end);
	}
	uint64_t from = inside ? hi : end, to = L->size - end > PF_AHEAD ? end + PF_AHEAD : L->size;
	if (from >= to)
		return;
	uint64_t nlo = (inside ? lo : off) / PF_UNIT, nhi = to == L->size ? (to + PF_UNIT - 1) / PF_UNIT : to / PF_UNIT;
	if (nhi <= 0xffffffffu &&
	    !atomic_compare_exchange_strong_explicit(win, &w, nlo << 32 | nhi, memory_order_relaxed, memory_order_relaxed))
		return; /* another thread moved the window and fetches ahead of it */
	fetch_range(n, resid, L, from, to);
}

/* Sets the access advice of every source mapping once, before serving (see above). */
void advise_sources(const tp_fs *fs)
{
	for (uint32_t i = 0; i < fs->nn; i++) {
		const tp_node *n = &fs->m->n[i];
		if (n->kind == TN_TENSORS && n->map && fs->o->source_io != 1 &&
		    madvise((void *)n->map, n->src_size, MADV_RANDOM) < 0)
			tp_log(0, "%s: cannot turn off readahead on the source (%s): a node may read more than its ranks need",
			       n->path, strerror(errno));
	}
}

static void op_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	tp_fs *fs = fuse_req_userdata(req);
	/* O_APPEND without write access opens, as on a read-only ext4 or tmpfs mount */
	if ((fi->flags & O_ACCMODE) != O_RDONLY || (fi->flags & O_TRUNC)) {
		fuse_reply_err(req, EROFS);
		return;
	}
	if (ino == fs->stats_ino) {
		fhandle *h = calloc(1, sizeof *h);
		if (h)
			h->buf = stats_text(fs, &h->len);
		if (!h || !h->buf) {
			free(h);
			fuse_reply_err(req, ENOMEM);
			return;
		}
		fh_track(fs, h);
		fi->fh = (uint64_t)(uintptr_t)h;
		fi->direct_io = 1;
		fuse_reply_open(req, fi);
		return;
	}
	uint32_t r, i;
	if (ino == fs->cfg_ino) { /* MNT/config.json: the source's, served from memory */
		fi->keep_cache = 1;
		if (atomic_load(&fs->ns[fs->m->config_node].bad))
			fuse_reply_err(req, EIO);
		else
			fuse_reply_open(req, fi);
		return;
	}
	size_t vp;
	if (vdecode(fs, ino, &r, &vp) == 0) { /* a part file of the view: checked on every read */
		fi->keep_cache = 1;
		fi->noflush = 1;
		fuse_reply_open(req, fi);
		return;
	}
	if (decode(fs, ino, &r, &i) < 0) {
		fuse_reply_err(req, ENOENT);
		return;
	}
	const tp_node *n = &fs->m->n[i];
	if (n->kind == TN_DIR) {
		fuse_reply_err(req, EISDIR);
		return;
	}
	fi->keep_cache = 1;
	fi->noflush = 1;
	if (atomic_load(&fs->ns[i].bad)) {
		fuse_reply_err(req, EIO);
		return;
	}
	/* A plain file costs no descriptor while open: each read opens the source (read_plain), so
	 * a reader holding many files cannot run the daemon out of descriptors. */
	int err = n->kind == TN_PLAIN ? source_check(fs, i, -1) : 0;
	if (err)
		fuse_reply_err(req, err);
	else
		fuse_reply_open(req, fi);
}

static void fh_track(tp_fs *fs, fhandle *h)
{
	pthread_mutex_lock(&fs->fh_lock);
	h->prev = NULL;
	h->next = fs->open_fh;
	if (h->next)
		h->next->prev = h;
	fs->open_fh = h;
	pthread_mutex_unlock(&fs->fh_lock);
}

static void fh_release(tp_fs *fs, fhandle *h)
{
	pthread_mutex_lock(&fs->fh_lock);
	if (h->prev)
		h->prev->next = h->next;
	else
		fs->open_fh = h->next;
	if (h->next)
		h->next->prev = h->prev;
	pthread_mutex_unlock(&fs->fh_lock);
	fh_free(h);
}

static void op_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	(void)ino;
	fhandle *h = (fhandle *)(uintptr_t)fi->fh;
	if (h)
		fh_release(fuse_req_userdata(req), h);
	fuse_reply_err(req, 0);
}

/* The local header of node i for rank r, generated on first use. */
static const uint8_t *get_hdr(tp_fs *fs, uint32_t i, uint32_t r)
{
	_Atomic(char *) *slot = &fs->hdr[(size_t)i * fs->T + r];
	char *h = atomic_load(slot);
	if (h)
		return (const uint8_t *)h;
	const tp_layout *L = &fs->m->n[i].lay[r];
	char *mine = malloc(L->hdr_size);
	if (!mine)
		return NULL;
	tp_layout_header(L, mine);
	char *expect = NULL;
	if (!atomic_compare_exchange_strong(slot, &expect, mine)) {
		free(mine);
		return (const uint8_t *)expect;
	}
	return (const uint8_t *)mine;
}

/* The gather backend for a reply of want bytes from nsrc source runs: CUDA for every strided
 * gather (--gather cuda), or past --cuda-min-runs and --cuda-min-bytes (auto, when both are set),
 * else the CPU. The one policy of rank-folder and view reads. */
static const tp_gather *pick_backend(const tp_fs *fs, size_t nsrc, uint64_t want)
{
	if ((fs->backend == TP_BACKEND_CUDA && nsrc > 1) ||
	    (fs->backend == TP_BACKEND_CUDA_PAST && nsrc >= fs->o->cuda_min_runs && want >= fs->o->cuda_min_bytes))
		return &fs->gpu;
	return &tp_gather_cpu_backend;
}

/* Replies to a read of rank r's view of tensor file i. Source bytes are copied into this
 * thread's buffer (by the chosen backend, under the SIGBUS guard) and the source's identity is
 * checked again after the copy and before the reply: a write changes the file's mtime before
 * it changes bytes, so a reply never carries bytes of a write that began before that check (the
 * window is the copy itself, which README states). Replies without source bytes (header,
 * padding) point into the header and the zero page. --reply iov points replies into the source
 * mapping instead: the kernel then copies source bytes after every check (a tuning option). */
static void read_tensors(fuse_req_t req, tp_fs *fs, uint32_t r, uint32_t i, size_t size, off_t off)
{
	tp_node *n = &fs->m->n[i];
	const tp_layout *L = &n->lay[r];
	rank_stats *rs = &fs->rs[r];
	atomic_fetch_add_explicit(&rs->reads, 1, memory_order_relaxed);
	if ((uint64_t)off >= L->size) {
		fuse_reply_buf(req, NULL, 0);
		return;
	}
	int err = source_check(fs, i, n->fd);
	if (err) {
		fuse_reply_err(req, err);
		return;
	}
	uint64_t want = L->size - (uint64_t)off < size ? L->size - (uint64_t)off : size;
	const uint8_t *hdr = (uint64_t)off < L->hdr_size ? get_hdr(fs, i, r) : NULL;
	scratch *s = get_scratch(want);
	if (!s || ((uint64_t)off < L->hdr_size && !hdr)) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	uint64_t cov, touched = 0;
	size_t nr = tp_map(L, (uint64_t)off, want, s->runs, RUN_CAP, &cov);
	prefetch(fs, n, fs->ns[i].resid, L, &fs->win[(size_t)i * fs->T + r], (uint64_t)off, want, s->runs, nr, cov);
	size_t nsrc = 0;
	for (size_t k = 0; k < nr; k++)
		nsrc += s->runs[k].kind == TP_RUN_SRC;
	if (cov < want)
		nsrc = RUN_CAP; /* more runs than one pass maps */
	int iov_ok = cov == want && nr <= IOV_CAP && (nsrc == 0 || fs->o->reply == 1);
	const tp_gather *backend = pick_backend(fs, nsrc, want);
	if (backend != &tp_gather_cpu_backend)
		iov_ok = 0;
	if (iov_ok) {
		for (size_t k = 0; k < nr; k++) {
			const tp_run *run = &s->runs[k];
			s->iov[k].iov_len = run->len;
			if (run->kind == TP_RUN_SRC) {
				s->iov[k].iov_base = (void *)(n->map + run->off);
				touched += run->len;
			} else if (run->kind == TP_RUN_HDR) {
				s->iov[k].iov_base = (void *)(hdr + run->off);
			} else {
				/* zero runs longer than the zero page are split (rare: padding) */
				s->iov[k].iov_base = (void *)zero_page;
				if (run->len > sizeof zero_page)
					goto copy;
			}
		}
		atomic_fetch_add_explicit(&rs->served, want, memory_order_relaxed);
		atomic_fetch_add_explicit(&rs->touched, touched, memory_order_relaxed);
		int err = fuse_reply_iov(req, s->iov, (int)nr);
		if (err)
			tp_log(3, "%s (rank %u): reply of %llu bytes at %lld failed: %s", n->path, r,
			       (unsigned long long)want, (long long)off, strerror(-err));
		release_runs(fs, n, s->runs, nr);
		after_reply(fs, i);
		return;
	}
copy:;
	tp_src src = {.fd = n->fd, .map = n->map, .size = n->src_size};
	uint64_t done = 0;
	touched = 0;
	for (int pass = 0; done < want; pass++) {
		if (pass) /* the first pass's runs are those mapped above; map the rest as the copy goes */
			nr = tp_map(L, (uint64_t)off + done, want - done, s->runs, RUN_CAP, &cov);
		for (size_t k = 0; k < nr; k++)
			touched += s->runs[k].kind == TP_RUN_SRC ? s->runs[k].len : 0;
		tp_err ge;
		tp_err_clear(&ge);
		if (!cov) {
			tp_log(2, "%s (rank %u): no bytes map at %llu of %llu", n->path, r,
			       (unsigned long long)(off + done), (unsigned long long)L->size);
			fuse_reply_err(req, EIO);
			return;
		}
		if (tp_guarded_gather(backend, s->runs, nr, &src, hdr, s->buf + done, &ge) < 0) {
			if (ge.code == TP_ECHANGED)
				mark_bad(fs, i, "shorter than planned, or unreadable under its mapping");
			else
				tp_log(2, "%s (rank %u): gather failed: %s", n->path, r, ge.msg);
			fuse_reply_err(req, EIO);
			return;
		}
		release_runs(fs, n, s->runs, nr);
		done += cov;
	}
	if ((err = source_check(fs, i, n->fd))) { /* the identity again, after the copy */
		fuse_reply_err(req, err);
		return;
	}
	atomic_fetch_add_explicit(&rs->served, want, memory_order_relaxed);
	atomic_fetch_add_explicit(&rs->touched, touched, memory_order_relaxed);
	atomic_fetch_add_explicit(&rs->copied, 1, memory_order_relaxed);
	if (backend == &fs->gpu)
		atomic_fetch_add_explicit(&rs->gpu, 1, memory_order_relaxed);
	fuse_reply_buf(req, (const char *)s->buf, want);
	after_reply(fs, i);
}

/* The local bytes (header, then constants) of rank r's part p, made on first use. */
static const uint8_t *get_vloc(tp_fs *fs, uint32_t r, size_t p)
{
	_Atomic(uint8_t *) *slot = &fs->vloc[(size_t)r * fs->vnp + p];
	uint8_t *b = atomic_load(slot);
	if (b)
		return b;
	const tp_served *S = &fs->m->vs[(size_t)r * fs->vnp + p];
	uint8_t *mine = malloc(S->local_size ? S->local_size : 1);
	if (!mine)
		return NULL;
	tp_served_local(S, mine);
	uint8_t *expect = NULL;
	if (!atomic_compare_exchange_strong(slot, &expect, mine)) {
		free(mine);
		return expect;
	}
	return mine;
}

/* Every source part p reads may be served: 0, or the errno the request fails with. */
static int part_check(tp_fs *fs, size_t p)
{
	const tp_vpart *pt = &fs->m->vplan.parts[p];
	for (uint32_t k = 0; k < pt->nsrc; k++) {
		uint32_t node = fs->m->vsrc_node[pt->srcs[k]];
		int err = source_check(fs, node, fs->m->n[node].fd);
		if (err)
			return err;
	}
	return 0;
}

/* Asks for the source pages of runs (of several sources: each range names its source). */
static void fetch_served(const tp_fs *fs, size_t p, const tp_run *runs, size_t nr)
{
	if (fs->o->source_io != 0)
		return;
	const tp_vpart *pt = &fs->m->vplan.parts[p];
	tp_io_range rg[64];
	for (size_t done = 0; done < nr;) {
		size_t used, ng = tp_io_ranges_src(runs + done, nr - done, sys_page(), rg, 64, &used);
		for (size_t a = 0, b; a < ng; a = b) {
			for (b = a + 1; b < ng && rg[b].src == rg[a].src; b++)
				;
			uint32_t node = fs->m->vsrc_node[pt->srcs[rg[a].src]];
			if (fs->m->n[node].map)
				fetch_ranges(&fs->m->n[node], fs->ns[node].resid, rg + a, b - a);
		}
		if (!used)
			break;
		done += used;
	}
}

/* Replies to a read of rank r's part p of the view: the same pass as read_tensors over a file
 * whose runs read several sources (the part's table): every source checked before, the runs
 * mapped (tp_served_map) and their pages asked for, gathered into this thread's buffer, every
 * source checked again, the reply. */
static void read_served(fuse_req_t req, tp_fs *fs, uint32_t r, size_t p, size_t size, off_t off)
{
	const tp_served *S = &fs->m->vs[(size_t)r * fs->vnp + p];
	rank_stats *rs = &fs->rs[r];
	atomic_fetch_add_explicit(&rs->reads, 1, memory_order_relaxed);
	if ((uint64_t)off >= S->size) {
		fuse_reply_buf(req, NULL, 0);
		return;
	}
	int err = part_check(fs, p);
	if (err) {
		fuse_reply_err(req, err);
		return;
	}
	uint64_t want = S->size - (uint64_t)off < size ? S->size - (uint64_t)off : size;
	const uint8_t *loc = get_vloc(fs, r, p);
	scratch *s = get_scratch(want);
	if (!s || !loc) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	const tp_vpart *pt = &fs->m->vplan.parts[p];
	uint64_t done = 0, touched = 0;
	int on_gpu = 0;
	while (done < want) {
		uint64_t cov;
		size_t nr = tp_served_map(S, (uint64_t)off + done, want - done, s->runs, RUN_CAP, &cov);
		if (!cov) {
			tp_log(2, "model-rank-%u-part-%zu (view): no bytes map at %llu of %llu", r, p,
			       (unsigned long long)(off + done), (unsigned long long)S->size);
			fuse_reply_err(req, EIO);
			return;
		}
		fetch_served(fs, p, s->runs, nr);
		size_t nsrc = 0, nwiden = 0;
		for (size_t k = 0; k < nr; k++) {
			touched += tp_run_src_bytes(&s->runs[k]);
			nsrc += s->runs[k].kind == TP_RUN_SRC;
			nwiden += s->runs[k].kind == TP_RUN_WIDEN;
		}
		/* only the CPU backend widens */
		const tp_gather *backend = nwiden ? &tp_gather_cpu_backend
						  : pick_backend(fs, cov < want - done ? RUN_CAP : nsrc, want);
		on_gpu |= backend == &fs->gpu;
		tp_err ge;
		tp_err_clear(&ge);
		if (tp_guarded_gather_n(backend, s->runs, nr, fs->vtab[p], pt->nsrc, loc, s->buf + done, &ge) < 0) {
			if (ge.code == TP_ECHANGED) { /* the sources whose identity moved; if none did, all of them */
				int seen = 0;
				for (uint32_t k = 0; k < pt->nsrc; k++) {
					uint32_t node = fs->m->vsrc_node[pt->srcs[k]];
					seen |= source_check(fs, node, fs->m->n[node].fd) != 0;
				}
				for (uint32_t k = 0; !seen && k < pt->nsrc; k++)
					mark_bad(fs, fs->m->vsrc_node[pt->srcs[k]], "shorter than planned, or unreadable under its mapping");
			} else
				tp_log(2, "model-rank-%u-part-%zu (view): gather failed: %s", r, p, ge.msg);
			fuse_reply_err(req, EIO);
			return;
		}
		for (uint32_t k = 0; k < pt->nsrc; k++) {
			uint32_t node = fs->m->vsrc_node[pt->srcs[k]];
			release_runs_src(fs, &fs->m->n[node], s->runs, nr, k);
		}
		done += cov;
	}
	if ((err = part_check(fs, p))) { /* every source again, after the copy */
		fuse_reply_err(req, err);
		return;
	}
	atomic_fetch_add_explicit(&rs->served, want, memory_order_relaxed);
	atomic_fetch_add_explicit(&rs->touched, touched, memory_order_relaxed);
	atomic_fetch_add_explicit(&rs->copied, 1, memory_order_relaxed);
	if (on_gpu) /* counted as read_tensors counts it: a reply with a CUDA gather in it */
		atomic_fetch_add_explicit(&rs->gpu, 1, memory_order_relaxed);
	fuse_reply_buf(req, (const char *)s->buf, want);
	for (uint32_t k = 0; k < pt->nsrc; k++)
		after_reply(fs, fs->m->vsrc_node[pt->srcs[k]]);
}

/* Replies to a read of plain file i: the source is opened for this read alone (a link on its
 * path fails it, and marks it), checked, read and checked again, as for tensors. */
static void read_plain(fuse_req_t req, tp_fs *fs, uint32_t i, size_t size, off_t off)
{
	scratch *s = get_scratch(size);
	if (!s) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	int fd = open_real(fs->m->n[i].real, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		int err = errno;
		if (err == ELOOP)
			mark_bad(fs, i, "a link on its path");
		else if (transient(err))
			log_unchecked(fs, i, strerror(err), "this read fails with that error");
		fuse_reply_err(req, err == ELOOP || atomic_load(&fs->ns[i].bad) ? EIO : err);
		return;
	}
	int err = source_check(fs, i, fd);
	ssize_t got = err ? -1 : pread(fd, s->buf, size, off);
	if (!err && got < 0)
		err = errno;
	else if (!err)
		err = source_check(fs, i, fd); /* again after reading, as for tensors */
	close(fd);
	if (err) {
		fuse_reply_err(req, err);
		return;
	}
	fuse_reply_buf(req, (const char *)s->buf, (size_t)got);
	after_reply(fs, i);
}

static void op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi)
{
	tp_fs *fs = fuse_req_userdata(req);
	fhandle *h = (fhandle *)(uintptr_t)fi->fh;
	if (ino == fs->stats_ino) {
		/* reply from this thread's scratch: a RELEASE handled by another thread may free h->buf
		 * as soon as the kernel has the bytes, while this thread is still returning from writev */
		size_t o = (size_t)off < h->len ? (size_t)off : h->len, l = size < h->len - o ? size : h->len - o;
		scratch *s = get_scratch(l);
		if (!s) {
			fuse_reply_err(req, ENOMEM);
			return;
		}
		if (l)
			memcpy(s->buf, h->buf + o, l);
		fuse_reply_buf(req, (const char *)s->buf, l);
		return;
	}
	uint32_t r, i;
	if (ino == fs->cfg_ino) {
		uint32_t c = fs->m->config_node;
		uint64_t len = fs->m->config_len, o = (uint64_t)off < len ? (uint64_t)off : len;
		int err = source_check(fs, c, -1);
		if (err)
			fuse_reply_err(req, err);
		else
			fuse_reply_buf(req, fs->m->config_text + o, size < len - o ? size : len - o);
		return;
	}
	size_t vp;
	if (vdecode(fs, ino, &r, &vp) == 0) {
		read_served(req, fs, r, vp, size, off);
		return;
	}
	if (decode(fs, ino, &r, &i) < 0) {
		fuse_reply_err(req, ENOENT);
		return;
	}
	const tp_node *n = &fs->m->n[i];
	if (n->kind == TN_TENSORS) {
		read_tensors(req, fs, r, i, size, off);
	} else if (n->kind == TN_INDEX || n->kind == TN_CONFIG) {
		int err = source_check(fs, i, -1);
		if (err) {
			fuse_reply_err(req, err);
			return;
		}
		uint64_t len = n->gen_len[r], o = (uint64_t)off < len ? (uint64_t)off : len;
		fuse_reply_buf(req, n->gen[r] + o, size < len - o ? size : len - o);
		after_reply(fs, i);
	} else if (n->kind == TN_PLAIN) {
		read_plain(req, fs, i, size, off);
	} else {
		fuse_reply_err(req, EBADF);
	}
}

/* The read side of the operations table (fs_session.c assembles it): open, read, release. */
void read_ops(struct fuse_lowlevel_ops *o)
{
	o->open = op_open;
	o->release = op_release;
	o->read = op_read;
}
