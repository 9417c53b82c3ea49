/* fs_read.c: the read path: open, read and release of every file of a mount.
 *
 * Every served tensor file, a rank folder's (a layout) or a view's part file (a served file), is
 * read by one pass (read_file, over tp_file.h): check that every source it reads has not changed
 * (the watcher's mark, one fstat each), map the request to runs once, ask for the source pages of
 * those runs and of the next PF_AHEAD bytes (no kernel readahead on the sources: fetching below),
 * copy the runs into a per-thread buffer (the chosen gather backend; only its copies of source
 * bytes run under the SIGBUS guard), check the sources again, and reply. Replies without source
 * bytes (header, constants, padding) are iovecs into the local bytes and a zero page. Plain files
 * are opened for each read (read_plain), so an open file costs the daemon no descriptor. No
 * request allocates beyond its thread's scratch (and a file's local bytes, once), parses, or
 * looks up a name. The push thread (fs_push.c) has its bytes made by the same pass (push_bytes:
 * the same checks and copy, into its own scratch), and op_read counts the reads in flight, which
 * the push yields to. Which source pages are asked for ahead and released behind, and each
 * thread's scratch, are fs_resid.c's.
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
		if (!pass_open(fs, req, ino)) /* or served from its copy (fs_pass.c) */
			fuse_reply_open(req, fi);
		return;
	}
	if (decode(fs, ino, &r, &i) < 0) {
		fuse_reply_err(req, ENOENT);
		return;
	}
	const tp_node *n = &fs->m->tree.n[i];
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
	else if (n->kind == TN_PLAIN || !pass_open(fs, req, ino)) /* or served from its copy (fs_pass.c) */
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
	tp_fs *fs = fuse_req_userdata(req);
	fhandle *h = (fhandle *)(uintptr_t)fi->fh;
	if (h && fi->fh != PASS_FH)
		fh_release(fs, h);
	pass_release(fs, ino, fi->fh);
	fuse_reply_err(req, 0);
}

/* ---- one read path for every served tensor file ----
 *
 * A rank folder's tensor file (a layout) and a view's part file (a served file) are read by the
 * same pass, through tp_file.h: the file, its table of sources (a layout's holds one) and each
 * source's node, the slot of its local bytes and its prefetch window. rfile_tensors and
 * rfile_part make that description on the stack; read_file serves it. */

/* Rank r's copy of tensor file i. */
static void rfile_tensors(tp_fs *fs, uint32_t r, uint32_t i, rfile *rf)
{
	const tp_node *n = &fs->m->tree.n[i];
	size_t k = (size_t)i * fs->T + r;
	*rf = (rfile){.f = tp_file_of_layout(&n->lay[r]), .rank = r, .nsrc = 1, .loc = &fs->hdr[k], .win = &fs->win[k],
		      .path = n->path, .one = {.fd = n->fd, .map = n->map, .size = n->src_size}, .one_node = i};
	rf->tab = &rf->one;
	rf->node = &rf->one_node;
}

/* View rank r's part file p (one that exists: vdecode checked it). */
static void rfile_part(tp_fs *fs, uint32_t r, size_t p, rfile *rf)
{
	size_t k = (size_t)r * fs->vnp + p;
	tp_view_file vf;
	tp_model_view_file(fs->m, r, p, &vf);
	*rf = (rfile){.f = tp_file_of_served(vf.layout), .rank = r, .nsrc = vf.nsrc, .tab = fs->vtab[vf.part],
		      .node = vf.nodes, .loc = &fs->vloc[k], .win = &fs->vwin[k], .part = p, .m = fs->m};
}

/* How messages name the file: "PATH (rank R)" or "model-rank-R-part-P.safetensors (view)". */
static const char *rf_name(const rfile *rf, char *buf, size_t cap)
{
	if (rf->path)
		snprintf(buf, cap, "%s (rank %u)", rf->path, rf->rank);
	else {
		char nm[96];
		tp_model_view_name(rf->m, rf->rank, rf->part, nm, sizeof nm);
		snprintf(buf, cap, "%s (view)", nm);
	}
	return buf;
}

/* The file's local bytes, made on first use (NULL: out of memory). */
static const uint8_t *rf_local(const rfile *rf)
{
	uint8_t *b = atomic_load(rf->loc);
	if (b)
		return b;
	uint64_t len = tp_file_local_size(rf->f);
	uint8_t *mine = malloc(len ? len : 1);
	if (!mine)
		return NULL;
	tp_file_local(rf->f, mine);
	uint8_t *expect = NULL;
	if (!atomic_compare_exchange_strong(rf->loc, &expect, mine)) {
		free(mine);
		return expect;
	}
	return mine;
}

/* Every source the file reads may be served: 0, or the errno the request fails with. */
static int rf_check(tp_fs *fs, const rfile *rf)
{
	for (uint32_t k = 0; k < rf->nsrc; k++) {
		int err = source_check(fs, rf->node[k], fs->m->tree.n[rf->node[k]].fd);
		if (err)
			return err;
	}
	return 0;
}

/* The gather backend for a reply of want bytes from nsrc source runs: CUDA for every strided
 * gather (--gather cuda), or past --cuda-min-runs and --cuda-min-bytes (auto, when both are set),
 * else the CPU. */
static const tp_gather *pick_backend(const tp_fs *fs, size_t nsrc, uint64_t want)
{
	if ((fs->backend == TP_BACKEND_CUDA && nsrc > 1) ||
	    (fs->backend == TP_BACKEND_CUDA_PAST && nsrc >= fs->o->cuda_min_runs && want >= fs->o->cuda_min_bytes))
		return &fs->gpu;
	return &tp_gather_cpu_backend;
}

/* Points the iovec at the bytes of runs[0..nr): source runs into their source's mapping, local
 * runs into loc, zero runs into the zero page. 0, or -1 where a run cannot be pointed at (a
 * source that is not mapped, a zero run longer than the zero page, a widened run). */
static int point_iov(const rfile *rf, const tp_run *runs, size_t nr, const uint8_t *loc, struct iovec *iov,
		     uint64_t *touched)
{
	for (size_t k = 0; k < nr; k++) {
		const tp_run *run = &runs[k];
		iov[k].iov_len = run->len;
		if (run->kind == TP_RUN_SRC && rf->tab[run->src].map) {
			iov[k].iov_base = (void *)(rf->tab[run->src].map + run->off);
			*touched += run->len;
		} else if ((run->kind == TP_RUN_HDR || run->kind == TP_RUN_CONST) && loc) {
			iov[k].iov_base = (void *)(loc + run->off);
		} else if (run->kind == TP_RUN_ZERO && run->len <= sizeof zero_page) {
			iov[k].iov_base = (void *)zero_page;
		} else {
			return -1;
		}
	}
	return 0;
}

/* A gather of the file failed with TP_ECHANGED: the sources whose identity moved are marked (by
 * the check); if none did, every source is (a mapping that fails under a copy). */
static void rf_changed(tp_fs *fs, const rfile *rf)
{
	int seen = 0;
	for (uint32_t k = 0; k < rf->nsrc; k++)
		seen |= source_check(fs, rf->node[k], fs->m->tree.n[rf->node[k]].fd) != 0;
	for (uint32_t k = 0; !seen && k < rf->nsrc; k++)
		mark_bad(fs, rf->node[k], "shorter than planned, or unreadable under its mapping");
}

/* Copies file bytes [off, off + want) into out: runs[0..nr) are the first pass's runs (covering
 * cov bytes, nwiden of them widened or transposed), the rest are mapped as the copy goes, into the
 * same runs array (RUN_CAP). Each pass is gathered by backend (the CPU where it widens or
 * transposes) under the SIGBUS guard and its source pages released; with ps (the push, --push-io direct)
 * each pass's cold source pages are first read into ps's buffer (stage_cold). Returns 0 (*touched: source
 * bytes read, *on_gpu: a CUDA gather was used), or EIO: a changed source is marked (rf_changed),
 * any other failure logged. The sources are not checked here: the caller checks before and after. */
static int rf_copy(tp_fs *fs, const rfile *rf, uint64_t off, uint64_t want, const uint8_t *loc, const tp_gather *backend,
		   tp_run *runs, size_t nr, uint64_t cov, size_t nwiden, uint8_t *out, uint64_t *touched, int *on_gpu,
		   push_stage *ps)
{
	char nm[160];
	uint64_t done = 0;
	*touched = 0;
	for (int pass = 0; done < want; pass++) {
		if (pass) { /* the first pass's runs are those mapped by the caller; map the rest as the copy goes */
			nr = tp_file_map(rf->f, off + done, want - done, runs, RUN_CAP, &cov);
			for (size_t k = nwiden = 0; k < nr; k++)
				nwiden += runs[k].kind == TP_RUN_WIDEN || runs[k].kind == TP_RUN_TRANSPOSE;
		}
		if (!cov) {
			tp_log(2, "%s: no bytes map at %llu of %llu", rf_name(rf, nm, sizeof nm), (unsigned long long)(off + done),
			       (unsigned long long)tp_file_size(rf->f));
			note_failure(nm, "no bytes map at %llu of %llu (a bug of tpfs's): that read failed with EIO",
				     (unsigned long long)(off + done), (unsigned long long)tp_file_size(rf->f));
			return EIO;
		}
		for (size_t k = 0; k < nr; k++)
			*touched += tp_run_src_bytes(&runs[k]);
		const tp_gather *b = nwiden ? &tp_gather_cpu_backend : backend; /* only the CPU backend widens and transposes */
		const tp_src *tab = rf->tab;
		uint32_t ntab = rf->nsrc;
		if (ps) { /* the push: cold source pages read with O_DIRECT, those runs gathered from its buffer */
			uint64_t direct;
			int err = stage_cold(fs, ps, rf, runs, nr, &tab, &ntab, &direct);
			if (err == ESTALE)
				rf_changed(fs, rf);
			if (err)
				return EIO;
			if (direct) {
				b = &tp_gather_cpu_backend;
				atomic_fetch_add_explicit(&fs->push_direct, direct, memory_order_relaxed);
			}
		}
		*on_gpu |= b == &fs->gpu;
		tp_err ge;
		tp_err_clear(&ge);
		if (tp_guarded_gather_n(b, runs, nr, tab, ntab, loc, out + done, &ge) < 0) {
			if (ge.code == TP_ECHANGED)
				rf_changed(fs, rf);
			else {
				tp_log(2, "%s: gather failed: %s", rf_name(rf, nm, sizeof nm), ge.msg);
				note_failure(nm, "reading the source failed (%s): that read failed with EIO", ge.msg);
			}
			return EIO;
		}
		release_after(fs, rf, runs, nr);
		done += cov;
	}
	return 0;
}

/* The first steps of making file bytes [off, off + want) (want > 0, inside the file), shared by a read
 * and the push: every source checked, the local bytes where the range needs them, this thread's
 * scratch, the first pass's runs mapped into it and, with prefetch, their source pages (and the next
 * PF_AHEAD bytes') asked for, and the gather backend chosen. Returns 0 with *m set, or the errno of a
 * failed check, or ENOMEM (scratch or local bytes). */
typedef struct {
	scratch *s;
	const uint8_t *loc;        /* the file's local bytes, or NULL where the range needs none */
	size_t nr, nsrc, nwiden;   /* the first pass's runs; source runs (RUN_CAP: more than one pass); widened or transposed */
	uint64_t cov;              /* bytes the first pass's runs cover */
	const tp_gather *backend;
} rf_make;

static int rf_begin(tp_fs *fs, const rfile *rf, uint64_t off, uint64_t want, int prefetch, rf_make *m)
{
	int err = rf_check(fs, rf);
	if (err)
		return err;
	int need_loc = off < tp_file_hdr_size(rf->f) || tp_file_local_size(rf->f) > tp_file_hdr_size(rf->f);
	m->loc = need_loc ? rf_local(rf) : NULL;
	m->s = get_scratch(want);
	if (!m->s || (need_loc && !m->loc))
		return ENOMEM;
	m->nr = tp_file_map(rf->f, off, want, m->s->runs, RUN_CAP, &m->cov);
	if (prefetch)
		fetch_ahead(fs, rf, off, want, m->s->runs, m->nr, m->cov);
	m->nsrc = m->nwiden = 0;
	for (size_t k = 0; k < m->nr; k++) {
		m->nsrc += m->s->runs[k].kind == TP_RUN_SRC;
		m->nwiden += m->s->runs[k].kind == TP_RUN_WIDEN || m->s->runs[k].kind == TP_RUN_TRANSPOSE;
	}
	if (m->cov < want)
		m->nsrc = RUN_CAP; /* more runs than one pass maps */
	m->backend = m->nwiden ? &tp_gather_cpu_backend : pick_backend(fs, m->nsrc, want);
	return 0;
}

/* A read of file ino replied len bytes at off (of fsize), kept by the kernel in its page cache: the
 * whole REPLIED_UNIT blocks it covers are marked in fs->replied, and the push (fs_push.c) does not
 * store them again (a loader that overtook it). Lock-free; nothing where the push has not listed
 * the file. */
static void note_replied(tp_fs *fs, fuse_ino_t ino, uint64_t off, uint64_t len, uint64_t fsize)
{
	_Atomic uint64_t *map = fs->replied && ino < fs->nlooked ? fs->replied[ino] : NULL;
	if (!map || !len)
		return;
	uint64_t a = (off + REPLIED_UNIT - 1) / REPLIED_UNIT; /* the blocks the reply covers whole */
	uint64_t b = off + len >= fsize ? (fsize + REPLIED_UNIT - 1) / REPLIED_UNIT : (off + len) / REPLIED_UNIT;
	for (uint64_t u = a; u < b; u++)
		atomic_fetch_or_explicit(&map[u / 64], 1ull << (u % 64), memory_order_relaxed);
}

/* Replies to a read of a served tensor file. Every source is checked (the watcher's mark, one
 * fstat), the request mapped to runs (tp_file_map), their source pages and the next PF_AHEAD
 * bytes' asked for (no kernel readahead on the sources: fetching above), the runs copied into
 * this thread's buffer by the chosen gather backend (only its copies of source bytes run under
 * the SIGBUS guard), every source checked again, and the reply sent: a write changes a file's
 * mtime before it changes bytes, so a reply never carries bytes of a write that began before
 * that check (the window is the copy itself, which docs/SAFETY.md states). Replies without source bytes
 * (header, constants, padding) point into the local bytes and a zero page; --reply iov points
 * replies into the source mappings too (the kernel then copies source bytes after every check: a
 * tuning option). Widened runs are always copied, by the CPU. ino is the file's inode and flags its
 * open flags: a reply the kernel keeps in its page cache (not an O_DIRECT read's) is noted for the
 * push, which then does not store those bytes again (note_replied). */
static void read_file(fuse_req_t req, tp_fs *fs, const rfile *rf, fuse_ino_t ino, int flags, size_t size,
		      off_t off)
{
	uint64_t fsize = tp_file_size(rf->f);
	rank_stats *rs = &fs->rs[rf->rank];
	char nm[160];
	atomic_fetch_add_explicit(&rs->reads, 1, memory_order_relaxed);
	if ((uint64_t)off >= fsize) {
		fuse_reply_buf(req, NULL, 0);
		return;
	}
	uint64_t want = fsize - (uint64_t)off < size ? fsize - (uint64_t)off : size;
	rf_make m;
	int err = rf_begin(fs, rf, (uint64_t)off, want, 1, &m);
	if (err) {
		if (err == ENOMEM)
			note_failure(rf_name(rf, nm, sizeof nm),
				     "out of memory for a read of %llu bytes: that read failed with ENOMEM", (unsigned long long)want);
		fuse_reply_err(req, err);
		return;
	}
	scratch *s = m.s;
	size_t nr = m.nr;
	uint64_t touched = 0;
	if (m.cov == want && nr <= IOV_CAP && !m.nwiden && (m.nsrc == 0 || fs->o->reply == 1) &&
	    m.backend == &tp_gather_cpu_backend && point_iov(rf, s->runs, nr, m.loc, s->iov, &touched) == 0) {
		atomic_fetch_add_explicit(&rs->served, want, memory_order_relaxed);
		atomic_fetch_add_explicit(&rs->touched, touched, memory_order_relaxed);
		int rc = fuse_reply_iov(req, s->iov, (int)nr);
		if (rc)
			tp_log(3, "%s: reply of %llu bytes at %lld failed: %s", rf_name(rf, nm, sizeof nm),
			       (unsigned long long)want, (long long)off, strerror(-rc));
		else if (!(flags & O_DIRECT)) /* the kernel keeps the bytes in its page cache: the push skips them */
			note_replied(fs, ino, (uint64_t)off, want, fsize);
		release_after(fs, rf, s->runs, nr);
		for (uint32_t k = 0; k < rf->nsrc; k++)
			after_reply(fs, rf->node[k]);
		return;
	}
	int on_gpu = 0;
	if ((err = rf_copy(fs, rf, (uint64_t)off, want, m.loc, m.backend, s->runs, nr, m.cov, m.nwiden, s->buf, &touched,
			   &on_gpu, NULL))) {
		fuse_reply_err(req, err);
		return;
	}
	if ((err = rf_check(fs, rf))) { /* every source again, after the copy */
		fuse_reply_err(req, err);
		return;
	}
	atomic_fetch_add_explicit(&rs->served, want, memory_order_relaxed);
	atomic_fetch_add_explicit(&rs->touched, touched, memory_order_relaxed);
	atomic_fetch_add_explicit(&rs->copied, 1, memory_order_relaxed);
	if (on_gpu) /* a reply with a CUDA gather in it */
		atomic_fetch_add_explicit(&rs->gpu, 1, memory_order_relaxed);
	if (fuse_reply_buf(req, (const char *)s->buf, want) == 0 && !(flags & O_DIRECT))
		note_replied(fs, ino, (uint64_t)off, want, fsize); /* in the page cache now: the push skips it */
	for (uint32_t k = 0; k < rf->nsrc; k++)
		after_reply(fs, rf->node[k]);
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
	int fd = open_real(fs->m->tree.n[i].real, O_RDONLY | O_CLOEXEC);
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
	if (!err && got < 0) {
		err = errno;
		note_failure(fs->m->tree.n[i].path, "reading the source failed (%s): that read failed with that error", strerror(err));
	} else if (!err) {
		err = source_check(fs, i, fd); /* again after reading, as for tensors */
	}
	close(fd);
	if (err) {
		fuse_reply_err(req, err);
		return;
	}
	fuse_reply_buf(req, (const char *)s->buf, (size_t)got);
	after_reply(fs, i);
}

static void read_one(fuse_req_t req, tp_fs *fs, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi)
{
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
	rfile rf;
	if (vdecode(fs, ino, &r, &vp) == 0) {
		rfile_part(fs, r, vp, &rf);
		read_file(req, fs, &rf, ino, fi->flags, size, off);
		return;
	}
	if (decode(fs, ino, &r, &i) < 0) {
		fuse_reply_err(req, ENOENT);
		return;
	}
	const tp_node *n = &fs->m->tree.n[i];
	if (n->kind == TN_TENSORS) {
		rfile_tensors(fs, r, i, &rf);
		read_file(req, fs, &rf, ino, fi->flags, size, off);
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

/* A read, counted in fs->reads_now while the push is on: the push yields while any runs. */
static void op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi)
{
	tp_fs *fs = fuse_req_userdata(req);
	if (!fs->push_budget) {
		read_one(req, fs, ino, size, off, fi);
		return;
	}
	atomic_fetch_add_explicit(&fs->reads_now, 1, memory_order_relaxed);
	read_one(req, fs, ino, size, off, fi);
	atomic_fetch_sub_explicit(&fs->reads_now, 1, memory_order_relaxed);
}

/* ---- the push's bytes (fs_push.c) ---- */

/* The description of inode ino when it is a served tensor file or a view's part file: 0, else -1. */
static int rf_of_ino(tp_fs *fs, fuse_ino_t ino, rfile *rf)
{
	uint32_t r, i;
	size_t p;
	if (vdecode(fs, ino, &r, &p) == 0) {
		rfile_part(fs, r, p, rf);
		return 0;
	}
	if (decode(fs, ino, &r, &i) == 0 && fs->m->tree.n[i].kind == TN_TENSORS) {
		rfile_tensors(fs, r, i, rf);
		return 0;
	}
	return -1;
}

int push_bytes(tp_fs *fs, push_stage *ps, fuse_ino_t ino, uint64_t off, uint64_t want, const uint8_t **out,
	       uint64_t *touched)
{
	rfile rf;
	if (rf_of_ino(fs, ino, &rf) < 0)
		return ENOENT;
	uint64_t fsize = tp_file_size(rf.f);
	if (off >= fsize || !want)
		return EINVAL;
	want = fsize - off < want ? fsize - off : want;
	rf_make m;
	int on_gpu = 0, err = rf_begin(fs, &rf, off, want, !ps, &m);
	if (!err)
		err = rf_copy(fs, &rf, off, want, m.loc, m.backend, m.s->runs, m.nr, m.cov, m.nwiden, m.s->buf, touched,
			      &on_gpu, ps);
	if (!err)
		err = rf_check(fs, &rf); /* every source again, after the copy */
	if (!err)
		*out = m.s->buf;
	return err;
}

void push_whole(tp_fs *fs, fuse_ino_t ino)
{
	rfile rf;
	if (rf_of_ino(fs, ino, &rf) < 0)
		return;
	uint64_t units = (tp_file_size(rf.f) + PF_UNIT - 1) / PF_UNIT;
	if (units <= 0xffffffffu) /* the window [0, units): every page fetched (fetch_ahead) */
		atomic_store_explicit(rf.win, units, memory_order_relaxed);
}

int push_check(tp_fs *fs, fuse_ino_t ino)
{
	rfile rf;
	if (rf_of_ino(fs, ino, &rf) < 0)
		return ENOENT;
	return rf_check(fs, &rf);
}

void push_stored(tp_fs *fs, fuse_ino_t ino, uint64_t touched)
{
	rfile rf;
	if (rf_of_ino(fs, ino, &rf) < 0)
		return;
	/* the rank's source bytes count what its stored pages were made of, as a reply's: a store the
	 * kernel refused (ENOENT: pushed again later) counts nothing */
	atomic_fetch_add_explicit(&fs->rs[rf.rank].touched, touched, memory_order_relaxed);
	for (uint32_t k = 0; k < rf.nsrc; k++)
		after_reply(fs, rf.node[k]);
}

/* The read side of the operations table (fs_session.c assembles it): open, read, release. */
void read_ops(struct fuse_lowlevel_ops *o)
{
	o->open = op_open;
	o->release = op_release;
	o->read = op_read;
}
