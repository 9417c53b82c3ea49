/* fs.c: the FUSE low-level filesystem over a tp_model.
 *
 * Inodes are computed, never allocated: 1 is the top folder, 2 + r * nn + i is node i of the
 * model as rank r sees it (node 0 is the rank folder), and 2 + T * nn is .tpfs-stats. Every
 * inode lives as long as the mount, so lookup counts are not tracked.
 *
 * Read path (no parsing, no name lookup per request): decode the inode, check that the source
 * has not changed (the watcher's mark, one fstat), map the range to runs (tp_map), copy the runs
 * into a per-thread buffer (the chosen gather backend; only its copies of source bytes run under
 * the SIGBUS guard), check the source again, and reply. Replies without source bytes (header,
 * padding) are iovecs into the header and a zero page. Attributes and entries are cached for a
 * long time and file pages are kept across opens (keep_cache): the files never change while
 * mounted; a source that does change makes its rank files fail with EIO.
 *
 * Changed sources: every source file is watched itself and through its folders (inotify, a
 * watcher thread); a change marks the node and queues the invalidation of its cached pages, which
 * a separate thread sends to the kernel: no request handler ever waits on the kernel (an
 * invalidation waits for pages a READ in flight holds). Owner, group and mode are the source's.
 *
 * tp_fs_main acquires in order (the note page, per-node state, the background fork, the FUSE
 * session, signal handlers, the mount, the invalidation thread, the ready helper, the gather
 * backend, the watcher) and releases in reverse, one label per resource.
 */
#define FUSE_USE_VERSION 312
#include "fs.h"

#include <errno.h>
#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <libgen.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/openat2.h>
#include <sys/inotify.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <sys/socket.h>
#include <sys/sysmacros.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <syslog.h>
#include <time.h>
#include <unistd.h>

#include "gather.h"
#include "gather_module.h"
#include "guard.h"
#include "io_plan.h"

#define TIMEOUT (365.0 * 24 * 3600) /* entry and attribute cache lifetime, seconds */
#define RUN_CAP 4096                /* runs mapped per pass */
#define IOV_CAP 1000                /* segments in one iovec reply (below IOV_MAX) */
#define STATS_NAME ".tpfs-stats"
#define RA_NOTE 256                 /* bytes of the shared readahead note */
#define PF_AHEAD (8u << 20)         /* rank-file bytes whose source pages are asked for past a read */
#define PF_UNIT 4096                /* granularity of the prefetch window */
#define PF_SPAN (4u << 20)          /* most source bytes one residency check (mincore) covers */
#define WN_CHUNK (128u << 10)       /* most bytes asked for by one MADV_WILLNEED */
#define RC_CHUNK (1u << 20)         /* source bytes one residency mark covers (a power of two) */
#define RC_FRESH_MS 1000u           /* a chunk seen whole in the page cache this recently is not checked again */

/* ---- logging ---- */

int tp_log_debug;
static int log_syslog;
static char first_error[512]; /* the first error logged, for the parent in background mode */
static int daemon_fd = -1;     /* background mode: the socket to the waiting parent (see below) */
static FILE *log_file;

void tp_log(int level, const char *fmt, ...)
{
	static const char *names[] = {"warning", "info", "error", "debug"};
	if (level == 3 && !tp_log_debug)
		return;
	char msg[2048];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	if (level == 2 && !first_error[0])
		tp_fmt(first_error, sizeof first_error, "%s", msg);
	if (log_syslog) {
		static const int prio[] = {LOG_WARNING, LOG_INFO, LOG_ERR, LOG_DEBUG};
		syslog(prio[level], "%s", msg);
		return;
	}
	if (level == 2 && daemon_fd >= 0 && !log_file)
		return; /* background mode before detaching: the parent reports the error */
	FILE *f = log_file ? log_file : stderr;
	fprintf(f, "tpfs: %s: %s\n", names[level], msg);
	fflush(f);
}

/* libfuse's own messages ("fuse: ...") go through tp_log, so that background mode can report
 * the first of them to the waiting parent. */
static void log_fuse(enum fuse_log_level level, const char *fmt, va_list ap)
{
	static char line[1024]; /* libfuse writes some lines in pieces: log whole lines */
	static size_t len;
	vsnprintf(line + len, sizeof line - len, fmt, ap);
	len = strlen(line);
	if (len && line[len - 1] != '\n' && len < sizeof line - 1)
		return;
	while (len && line[len - 1] == '\n')
		line[--len] = 0;
	for (char *c = line; *c; c++)
		if (*c == '\n')
			*c = ' ';
	tp_log(level <= FUSE_LOG_ERR ? 2 : level == FUSE_LOG_WARNING ? 0 : level == FUSE_LOG_DEBUG ? 3 : 1, "%s", line);
	len = 0;
	line[0] = 0;
}

void tp_log_model(void *ctx, int level, const char *msg)
{
	(void)ctx;
	if (level != 0 || tp_log_shown(msg))
		tp_log(level, "%s", msg);
}

#define LOG_KINDS 64
static struct {
	uint64_t key, count;
	char first[160];
} log_kinds[LOG_KINDS];
static uint64_t log_unkinded; /* warnings past LOG_KINDS kinds */

int tp_log_shown(const char *msg)
{
	uint64_t h = 1469598103934665603ull; /* FNV-1a of the message without quoted text and digits */
	int quoted = 0;
	for (const unsigned char *c = (const unsigned char *)msg; *c; c++) {
		if (*c == '\'')
			quoted = !quoted;
		else if (!quoted && (*c < '0' || *c > '9'))
			h = (h ^ *c) * 1099511628211ull;
	}
	for (int k = 0; k < LOG_KINDS; k++) {
		if (!log_kinds[k].count) {
			log_kinds[k].key = h;
			tp_fmt(log_kinds[k].first, sizeof log_kinds[k].first, "%s", msg);
		}
		if (log_kinds[k].key == h)
			return ++log_kinds[k].count <= TP_LOG_REPEAT;
	}
	return ++log_unkinded <= TP_LOG_REPEAT;
}

void tp_log_repeats(void)
{
	for (int k = 0; k < LOG_KINDS && log_kinds[k].count; k++) {
		if (log_kinds[k].count > TP_LOG_REPEAT)
			tp_log(0, "... and %llu more warnings like \"%s\"",
			       (unsigned long long)(log_kinds[k].count - TP_LOG_REPEAT), log_kinds[k].first);
		log_kinds[k].count = 0;
	}
	if (log_unkinded > TP_LOG_REPEAT)
		tp_log(0, "... and %llu more warnings of other kinds", (unsigned long long)(log_unkinded - TP_LOG_REPEAT));
	log_unkinded = 0;
}

int tp_fs_nofile(uint64_t need, tp_err *e)
{
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
		return tp_fail(e, TP_EIO, "getrlimit: %s", strerror(errno));
	if (rl.rlim_cur < rl.rlim_max) {
		struct rlimit want = {rl.rlim_max, rl.rlim_max};
		if (setrlimit(RLIMIT_NOFILE, &want) == 0)
			rl.rlim_cur = rl.rlim_max;
	}
	if (need && need > rl.rlim_cur)
		return tp_fail(e, TP_ELIMIT, "%llu open files are needed (one per safetensors file, and a few more) but the "
			       "open-file limit is %llu (hard limit %llu): raise the hard limit (ulimit -Hn, or "
			       "LimitNOFILE= for a service)", (unsigned long long)need, (unsigned long long)rl.rlim_cur,
			       (unsigned long long)rl.rlim_max);
	return 0;
}

/* ---- state ---- */

typedef struct rank_stats {
	_Atomic uint64_t served;  /* bytes replied */
	_Atomic uint64_t touched; /* source bytes read to produce them */
	_Atomic uint64_t reads;   /* read requests */
	_Atomic uint64_t copied;  /* requests served by copying (not an iovec) */
	_Atomic uint64_t gpu;     /* of those, gathered by the CUDA backend */
	char pad[24];
} rank_stats;

typedef struct nstate nstate;
typedef struct watch watch;

typedef struct tp_fs {
	tp_model *m;
	const tp_fs_opts *o;
	struct fuse_session *se;
	uint32_t nn, T;
	fuse_ino_t stats_ino;
	fuse_ino_t cfg_ino;         /* MNT/config.json (the source's), or 0 when there is none */
	pthread_mutex_t fh_lock;    /* guards open_fh */
	struct fhandle *open_fh;    /* handles not released yet: an unmount may leave RELEASE unsent */
	_Atomic(char *) *hdr;  /* [i * T + r]: local header bytes, made on first use */
	nstate *ns;            /* [i]: per node */
	int inval[2];          /* node numbers to invalidate (| INVAL_ATTR: attributes only) */
	_Atomic int inval_lost;/* the pipe was full: invalidate every changed node */
	pthread_t invalidator;
	_Atomic uint64_t *win; /* [i * T + r]: prefetch window, rank-file units of PF_UNIT: lo << 32 | hi */
	rank_stats *rs;        /* [r] */
	struct timespec started;
	char *ra_note;         /* what was done about readahead (shared with the helper process) */
	_Atomic int ready;
	/* source watching */
	int ifd;               /* inotify descriptor, or -1 */
	int stop[2];           /* closing stop[1] ends the watcher */
	watch *w;              /* (watch descriptor, name) -> node, sorted */
	size_t nw;
	pthread_t watcher;
	int watching;
	/* gather backends */
	tp_gather gpu;         /* the CUDA backend when loaded */
	enum {
		TP_BACKEND_CPU,       /* every gather on the CPU */
		TP_BACKEND_CUDA,      /* CUDA for every strided gather */
		TP_BACKEND_CUDA_PAST, /* CUDA for gathers past --cuda-min-runs and --cuda-min-bytes */
	} backend;
	char gather_note[256];
} tp_fs;

/* Per node: what reads and the watcher share. */
typedef struct nstate {
	_Atomic int bad;              /* the source changed: reads fail with EIO */
	_Atomic int pend;             /* an invalidation of its pages is queued */
	_Atomic uint64_t ctime;       /* the source's ctime (ns) last accepted */
	_Atomic uint32_t mode, uid, gid; /* of the source, served */
	_Atomic uint32_t *resid;      /* per RC_CHUNK of source (exact reads): when (ms, 0 = never) a
	                               * residency check last found every page of it cached */
} nstate;

#define INVAL_ATTR 0x80000000u

typedef struct watch {
	int wd;
	char *name;
	uint32_t node;
} watch;

/* A handle of an open stats file (plain files hold none: read_plain). */
typedef struct fhandle {
	char *buf; /* the text, as of the open */
	size_t len;
	struct fhandle *prev, *next; /* on tp_fs.open_fh until released */
} fhandle;

static const uint8_t zero_page[1 << 20];

static void fh_free(fhandle *h)
{
	free(h->buf);
	free(h);
}

/* Puts h on the list of open handles (so that teardown frees what no RELEASE reached). */
static void fh_track(struct tp_fs *fs, fhandle *h);
/* Takes h off that list and frees it. */
static void fh_release(struct tp_fs *fs, fhandle *h);

/* Drops this process's page-table entries of the source pages behind runs (the pages stay in
 * the page cache): without it, every source page a reply touched would count in the daemon's
 * RSS, a 700 GB checkpoint read once would show as 700 GB resident. */
static void release_runs(const tp_fs *fs, const tp_node *n, const tp_run *runs, size_t nr)
{
	if (!fs->o->release_pages || !n->map)
		return;
	uint64_t lo = UINT64_MAX, hi = 0;
	for (size_t k = 0; k < nr; k++) {
		if (runs[k].kind != TP_RUN_SRC)
			continue;
		lo = runs[k].off < lo ? runs[k].off : lo;
		hi = runs[k].off + runs[k].len > hi ? runs[k].off + runs[k].len : hi;
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
static void advise_sources(const tp_fs *fs)
{
	for (uint32_t i = 0; i < fs->nn; i++) {
		const tp_node *n = &fs->m->n[i];
		if (n->kind == TN_TENSORS && n->map && fs->o->source_io != 1 &&
		    madvise((void *)n->map, n->src_size, MADV_RANDOM) < 0)
			tp_log(0, "%s: cannot turn off readahead on the source (%s): a node may read more than its ranks need",
			       n->path, strerror(errno));
	}
}

/* Is rank r served (--ranks)? */
static int served(const tp_fs *fs, uint32_t r)
{
	return !fs->o->serve || fs->o->serve[r];
}

/* Per-thread scratch, made on a thread's first read and freed when it exits. */
typedef struct scratch {
	tp_run runs[RUN_CAP];
	struct iovec iov[IOV_CAP];
	uint8_t *buf;
	size_t cap;
} scratch;

static pthread_key_t scratch_key;

static void scratch_free(void *p)
{
	scratch *s = p;
	if (s) {
		free(s->buf);
		free(s);
	}
}

static scratch *get_scratch(size_t need)
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

/* ---- inodes and attributes ---- */

static fuse_ino_t ino_of(const tp_fs *fs, uint32_t r, uint32_t i)
{
	return 2 + (fuse_ino_t)r * fs->nn + i;
}

static int decode(const tp_fs *fs, fuse_ino_t ino, uint32_t *r, uint32_t *i)
{
	if (ino < 2 || ino >= fs->stats_ino)
		return -1;
	*r = (uint32_t)((ino - 2) / fs->nn);
	*i = (uint32_t)((ino - 2) % fs->nn);
	return served(fs, *r) ? 0 : -1;
}

static size_t stats_size(const tp_fs *fs);

static void fill_attr(const tp_fs *fs, fuse_ino_t ino, struct stat *st)
{
	memset(st, 0, sizeof *st);
	st->st_ino = ino;
	/* Owner, group and permission bits are those of the file (or folder) actually read, a link's
	 * target, with write, set-id and sticky bits cleared; the kernel checks them
	 * (default_permissions). The top folder and the stats file take the source folder's. */
	uint32_t top_mode = atomic_load(&fs->ns[0].mode);
	st->st_uid = atomic_load(&fs->ns[0].uid);
	st->st_gid = atomic_load(&fs->ns[0].gid);
	st->st_blksize = 1 << 20;
	uint32_t r, i;
	if (ino == FUSE_ROOT_ID) {
		st->st_mode = S_IFDIR | (top_mode & 0555);
		st->st_nlink = 2 + (fs->o->serve ? fs->o->nserve : fs->T);
		st->st_size = 4096;
		st->st_mtim = fs->m->n[0].mtime;
	} else if (ino == fs->stats_ino) {
		st->st_mode = S_IFREG | (top_mode & 0444);
		st->st_nlink = 1;
		st->st_size = (off_t)stats_size(fs); /* generated on open, padded to this size */
		st->st_mtim = fs->started;
	} else if (ino == fs->cfg_ino) { /* the source's config.json: its owner and mode */
		uint32_t c = fs->m->config_node;
		st->st_mode = S_IFREG | (atomic_load(&fs->ns[c].mode) & 0555);
		st->st_uid = atomic_load(&fs->ns[c].uid);
		st->st_gid = atomic_load(&fs->ns[c].gid);
		st->st_nlink = 1;
		st->st_size = (off_t)fs->m->config_len;
		st->st_mtim = fs->m->n[fs->m->config_node].mtime;
	} else if (decode(fs, ino, &r, &i) == 0) {
		const tp_node *n = &fs->m->n[i];
		uint32_t mode = atomic_load(&fs->ns[i].mode);
		st->st_mtim = n->mtime;
		st->st_uid = atomic_load(&fs->ns[i].uid);
		st->st_gid = atomic_load(&fs->ns[i].gid);
		if (n->kind == TN_DIR) {
			st->st_mode = S_IFDIR | (mode & 0555);
			st->st_nlink = 2;
			for (uint32_t k = 0; k < n->nchild; k++)
				st->st_nlink += fs->m->n[n->child[k]].kind == TN_DIR;
			st->st_size = 4096;
		} else {
			st->st_mode = S_IFREG | (mode & 0555);
			st->st_nlink = 1;
			st->st_size = (off_t)tp_node_size(fs->m, i, r);
		}
	}
	st->st_atim = st->st_ctim = st->st_mtim;
	st->st_blocks = (st->st_size + 511) / 512;
}

static void reply_entry(fuse_req_t req, const tp_fs *fs, fuse_ino_t ino)
{
	struct fuse_entry_param e;
	memset(&e, 0, sizeof e);
	e.ino = ino;
	e.generation = 1;
	e.attr_timeout = e.entry_timeout = TIMEOUT;
	fill_attr(fs, ino, &e.attr);
	fuse_reply_entry(req, &e);
}

/* ---- changed sources ---- */

/* The identity of a source as planned is (size, mtime, device, inode), plus its ctime, which
 * also moves on an attribute change (chmod, chown): a ctime that moved while size and mtime did
 * not is accepted as an attribute change by the watcher (which has seen no write), and until it
 * has looked, reads of that file fail with EIO without failing the file. */

static uint64_t ts_ns(struct timespec t)
{
	return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* Queues an invalidation of node i: of every rank's cached pages, or with attr only of the
 * attributes. Never waits: the invalidation thread talks to the kernel (an invalidation waits
 * for pages that a READ in flight holds locked, which must never be the READ's own thread). */
static void queue_inval(tp_fs *fs, uint32_t i, int attr)
{
	if (fs->inval[1] < 0)
		return;
	if (!attr && atomic_exchange(&fs->ns[i].pend, 1))
		return; /* already queued */
	uint32_t v = i | (attr ? INVAL_ATTR : 0);
	if (write(fs->inval[1], &v, sizeof v) != (ssize_t)sizeof v)
		atomic_store(&fs->inval_lost, 1); /* the pipe is full: the thread sweeps every node */
}

/* Marks node i's source as changed: logs once, and has every rank's cached pages of it dropped
 * so that later reads reach the daemon and fail with EIO instead of returning stale bytes. */
static void mark_bad(tp_fs *fs, uint32_t i, const char *why)
{
	if (atomic_exchange(&fs->ns[i].bad, 1))
		return;
	tp_log(2, "%s: the source changed since it was mounted (%s); its rank files now fail with EIO "
		  "(remount to serve the new version)", fs->m->n[i].path, why);
	queue_inval(fs, i, 0);
}

/* Opens a source's resolved path (which holds no link) without following any link on the way:
 * a link met means a folder on the path was replaced since mounting, perhaps by a link into the
 * mount itself, where this thread would wait on its own mount (with every worker waiting, even
 * SIGTERM cannot end the daemon). Fails with ELOOP then. */
static int open_real(const char *real, int flags)
{
#ifdef SYS_openat2
	struct open_how how = {.flags = (uint64_t)(flags | O_NOFOLLOW), .resolve = RESOLVE_NO_SYMLINKS};
	int fd = (int)syscall(SYS_openat2, AT_FDCWD, real, &how, sizeof how);
	if (fd >= 0 || (errno != ENOSYS && errno != EPERM))
		return fd;
#endif
	return open(real, flags | O_NOFOLLOW);
}

/* Whether err is a passing shortage of the daemon's (descriptors, memory, a signal) rather than
 * something about the source: then nothing can be said about the source, and nothing is marked. */
static int transient(int err)
{
	return err == EMFILE || err == ENFILE || err == ENOMEM || err == EINTR || err == EAGAIN || err == ENOBUFS;
}

/* Compares the file behind fd (or, with fd < 0, node i's resolved path) with what was planned.
 * Returns 0 (the same), 1 (changed: why says how), 2 (only the ctime moved: an attribute
 * change the watcher has not accepted yet; with accept, it is accepted now) or 3 (it could not
 * be looked at for a transient reason, transient(errno): why says which; nothing is known). */
static int differs(tp_fs *fs, uint32_t i, int fd, int accept, char *why, size_t len)
{
	const tp_node *n = &fs->m->n[i];
	struct stat st;
	/* the resolved path is not followed if it, or a folder on it, has become a link since (it may
	 * lead into the mount) */
	int own = fd < 0 ? open_real(n->real, O_PATH | O_CLOEXEC) : fd;
	int rc = own < 0 ? -1 : fstat(own, &st);
	int err = errno;
	if (fd < 0 && own >= 0)
		close(own);
	if (rc < 0) {
		tp_fmt(why, len, "%s", strerror(err));
		errno = err;
		return transient(err) ? 3 : 1;
	}
	if (n->kind != TN_DIR && (uint64_t)st.st_size != n->src_size)
		tp_fmt(why, len, "size %llu, was %llu", (unsigned long long)st.st_size, (unsigned long long)n->src_size);
	else if (n->kind != TN_DIR && (st.st_mtim.tv_sec != n->mtime.tv_sec || st.st_mtim.tv_nsec != n->mtime.tv_nsec))
		tp_fmt(why, len, "modified");
	else if (st.st_ino != n->ino || st.st_dev != n->dev)
		tp_fmt(why, len, "replaced by another file");
	else if (ts_ns(st.st_ctim) == atomic_load(&fs->ns[i].ctime))
		return 0;
	else if (!accept && fs->watching)
		return 2;
	else {
		/* an attribute change: serve the new owner, group and mode from now on */
		atomic_store(&fs->ns[i].ctime, ts_ns(st.st_ctim));
		atomic_store(&fs->ns[i].mode, (uint32_t)st.st_mode);
		atomic_store(&fs->ns[i].uid, (uint32_t)st.st_uid);
		atomic_store(&fs->ns[i].gid, (uint32_t)st.st_gid);
		queue_inval(fs, i, 1);
		return 0;
	}
	return 1;
}

/* Logs that node i's source could not be checked (why) and that only this request fails. */
static void log_unchecked(const tp_fs *fs, uint32_t i, const char *why, const char *what)
{
	char msg[TP_ERR_MSG];
	tp_fmt(msg, sizeof msg, "%s: the source could not be checked (%s): %s; the file stays served",
	       fs->m->n[i].path, why, what);
	if (tp_log_shown(msg))
		tp_log(0, "%s", msg);
}

/* May node i be served? One fstat of the open source (or a stat of its resolved path). Returns
 * 0, or the errno the request must fail with: EIO when the source changed (the file is marked
 * changed then, for good) or only its ctime moved; the transient errno (EMFILE, ENOMEM, ...) when
 * it could not be looked at, which fails this request alone. */
static int source_check(tp_fs *fs, uint32_t i, int fd)
{
	if (atomic_load(&fs->ns[i].bad))
		return EIO;
	char why[96];
	int d = differs(fs, i, fd, 0, why, sizeof why);
	if (d == 3) {
		int err = errno;
		log_unchecked(fs, i, why, "this read fails with that error");
		return err;
	}
	if (d == 1)
		mark_bad(fs, i, why);
	return d ? EIO : 0;
}

/* After a successful reply: a change noticed while the reply was under way may have been
 * followed by its invalidation before the kernel cached this reply's pages; drop them again. */
static void after_reply(tp_fs *fs, uint32_t i)
{
	if (atomic_load(&fs->ns[i].bad))
		queue_inval(fs, i, 0);
}

static void *inval_thread(void *p)
{
	tp_fs *fs = p;
	uint32_t v[1024];
	for (;;) {
		ssize_t got = read(fs->inval[0], v, sizeof v);
		if (got < 0 && errno == EINTR)
			continue;
		if (got <= 0)
			break; /* the write end closed: unmounting */
		for (size_t k = 0; k < (size_t)got / sizeof *v; k++) {
			uint32_t i = v[k] & ~INVAL_ATTR;
			if (!(v[k] & INVAL_ATTR))
				atomic_store(&fs->ns[i].pend, 0);
			for (uint32_t r = 0; r < fs->T && atomic_load(&fs->ready); r++)
				fuse_lowlevel_notify_inval_inode(fs->se, ino_of(fs, r, i), v[k] & INVAL_ATTR ? -1 : 0, 0);
			if (i == 0 && atomic_load(&fs->ready)) { /* the top folder and the stats file take SRC's too */
				fuse_lowlevel_notify_inval_inode(fs->se, FUSE_ROOT_ID, -1, 0);
				fuse_lowlevel_notify_inval_inode(fs->se, fs->stats_ino, -1, 0);
			}
		}
		if (atomic_exchange(&fs->inval_lost, 0))
			for (uint32_t i = 0; i < fs->nn; i++)
				for (uint32_t r = 0; r < fs->T && atomic_load(&fs->ready); r++)
					fuse_lowlevel_notify_inval_inode(fs->se, ino_of(fs, r, i), atomic_load(&fs->ns[i].bad) ? 0 : -1, 0);
	}
	return NULL;
}

/* Starts a thread of our own with every signal blocked (as libfuse starts its workers): SIGTERM
 * and SIGINT must reach the thread that waits for the FUSE loop to end, not one that would take
 * the signal and go back to waiting while the loop never learns of it. */
static int start_thread(pthread_t *t, void *(*fn)(void *), void *arg)
{
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &old);
	int rc = pthread_create(t, NULL, fn, arg);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	return rc;
}

static int start_inval(tp_fs *fs)
{
	if (pipe2(fs->inval, O_CLOEXEC) < 0)
		return -1;
	fcntl(fs->inval[1], F_SETFL, O_NONBLOCK);
	if (start_thread(&fs->invalidator, inval_thread, fs) != 0) {
		close(fs->inval[0]);
		close(fs->inval[1]);
		fs->inval[0] = fs->inval[1] = -1;
		return -1;
	}
	return 0;
}

/* Ends the FUSE connection (before the session is destroyed) and stops the invalidation thread.
 * The connection goes first: an invalidation may be waiting for a page that a READ holds locked,
 * and once the loop has ended nobody answers that READ. Replacing the /dev/fuse descriptor by
 * /dev/null drops the last reference to it (the ready helper holds none), the kernel ends every
 * pending request, and the invalidation returns; fuse_session_destroy later closes /dev/null. */
static void stop_inval(tp_fs *fs)
{
	struct pollfd pfd = {.fd = fuse_session_fd(fs->se), .events = 0};
	int gone = poll(&pfd, 1, 0) == 1 && (pfd.revents & POLLERR); /* unmounted already */
	int nul = gone ? -1 : open("/dev/null", O_RDWR | O_CLOEXEC);
	if (nul >= 0) {
		dup3(nul, pfd.fd, O_CLOEXEC);
		close(nul);
	}
	int w = fs->inval[1];
	fs->inval[1] = -1;
	close(w);
	pthread_join(fs->invalidator, NULL);
	close(fs->inval[0]);
	fs->inval[0] = -1;
}

/* ---- watching sources (inotify) ---- */

/* Every file is watched itself (its inode: a write through any path, a hard link outside SRC
 * included, is seen) and through its folders, those of its path in SRC and of its resolved path
 * (a rename over it, a removal, a link re-pointed). */

static void recheck_all(tp_fs *fs)
{
	for (uint32_t i = 0; i < fs->nn; i++) {
		char why[96];
		if (atomic_load(&fs->ns[i].bad))
			continue;
		int d = differs(fs, i, -1, 1, why, sizeof why); /* a folder's new mode is accepted */
		if (d == 1 && fs->m->n[i].kind != TN_DIR)
			mark_bad(fs, i, why);
		else if (d == 3) /* reads still check the file themselves */
			log_unchecked(fs, i, why, "a change notice was not followed up");
	}
}

static int cmp_watch(const void *a, const void *b)
{
	const watch *x = a, *y = b;
	return x->wd != y->wd ? (x->wd < y->wd ? -1 : 1) : strcmp(x->name, y->name);
}

/* What an event on a watched file or folder means for node i. */
static void on_event(tp_fs *fs, uint32_t i, const struct inotify_event *ev)
{
	char why[96];
	const tp_node *n = &fs->m->n[i];
	if (ev->len && n->kind == TN_DIR) {
		/* a folder renamed, removed or replaced: the names under it may now mean other files */
		if (ev->mask & (IN_MOVED_TO | IN_CREATE | IN_DELETE | IN_MOVED_FROM))
			recheck_all(fs);
		return;
	}
	if (ev->len) { /* a name in a watched folder: the name now means another file, or none */
		if (ev->mask & (IN_MOVED_TO | IN_CREATE))
			mark_bad(fs, i, "replaced");
		else if (ev->mask & (IN_DELETE | IN_MOVED_FROM))
			mark_bad(fs, i, "removed or renamed");
		return;
	}
	if (ev->mask & IN_MODIFY) {
		if (n->kind != TN_DIR)
			mark_bad(fs, i, "written");
	} else if (ev->mask & (IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVE_SELF | IN_DELETE_SELF)) {
		/* an attribute change or a close after writing: a change only if the content's size,
		 * mtime or identity moved */
		int d = differs(fs, i, -1, 1, why, sizeof why); /* a folder's new mode is accepted */
		if (d == 1 && n->kind != TN_DIR)
			mark_bad(fs, i, why);
		else if (d == 3) /* reads still check the file themselves */
			log_unchecked(fs, i, why, "a change notice was not followed up");
	}
}

static void *watch_thread(void *p)
{
	tp_fs *fs = p;
	char buf[16384] __attribute__((aligned(__alignof__(struct inotify_event))));
	struct pollfd pfd[2] = {{.fd = fs->ifd, .events = POLLIN}, {.fd = fs->stop[0], .events = POLLIN}};
	for (;;) {
		if (poll(pfd, 2, -1) < 0 && errno != EINTR)
			break;
		if (pfd[1].revents)
			break;
		if (!(pfd[0].revents & POLLIN))
			continue;
		ssize_t len = read(fs->ifd, buf, sizeof buf);
		for (char *q = buf; len > 0 && q < buf + len;) {
			const struct inotify_event *ev = (const struct inotify_event *)q;
			q += sizeof *ev + ev->len;
			if (ev->mask & IN_Q_OVERFLOW) {
				recheck_all(fs);
				continue;
			}
			const char *name = ev->len ? ev->name : "";
			watch key = {.wd = ev->wd, .name = (char *)name};
			size_t lo = 0, hi = fs->nw;
			while (lo < hi) { /* the first entry not below key */
				size_t mid = lo + (hi - lo) / 2;
				if (cmp_watch(&fs->w[mid], &key) < 0)
					lo = mid + 1;
				else
					hi = mid;
			}
			for (size_t k = lo; k < fs->nw && !cmp_watch(&fs->w[k], &key); k++)
				on_event(fs, fs->w[k].node, ev);
		}
	}
	return NULL;
}

/* Watches path (a folder, for name events of name; or with name "" the file or folder itself). */
static int add_watch(tp_fs *fs, const char *path, const char *name, uint32_t node, size_t *cap)
{
	const uint32_t mask = *name ? IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE | IN_ONLYDIR
				    : IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_DELETE_SELF | IN_MOVE_SELF;
	/* the mount exists by now: path (resolved at planning) is opened without following any link
	 * (a folder swapped for a link into MNT would make inotify_add_watch wait on the mount, whose
	 * loop this thread has yet to run), and the watch is added through the fd */
	int fd = open_real(path, O_PATH | O_CLOEXEC | (*name ? O_DIRECTORY : 0));
	if (fd < 0)
		return -1;
	char proc[64];
	snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd);
	int wd = inotify_add_watch(fs->ifd, proc, mask | IN_MASK_ADD);
	int err = errno;
	close(fd);
	errno = err;
	if (wd < 0)
		return -1;
	if (fs->nw == *cap) {
		size_t nc = *cap ? *cap * 2 : 64;
		watch *nw = realloc(fs->w, nc * sizeof *nw);
		if (!nw)
			return -1;
		fs->w = nw;
		*cap = nc;
	}
	fs->w[fs->nw].wd = wd;
	fs->w[fs->nw].node = node;
	fs->w[fs->nw].name = strdup(name);
	if (!fs->w[fs->nw].name)
		return -1;
	fs->nw++;
	return 0;
}

/* Watches the folder path of a file for name events of its last component. path holds no link
 * (add_watch refuses one). */
static int add_name_watch(tp_fs *fs, const char *path, uint32_t node, size_t *cap)
{
	char *d = strdup(path), *b = strdup(path);
	int rc = d && b ? add_watch(fs, dirname(d), basename(b), node, cap) : -1;
	free(d);
	free(b);
	return rc;
}

static void start_watching(tp_fs *fs)
{
	fs->ifd = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
	if (fs->ifd < 0 || pipe(fs->stop) < 0) {
		tp_log(0, "cannot watch the sources (%s): changes are noticed by size and mtime checks only", strerror(errno));
		return;
	}
	size_t cap = 0, failed = 0;
	int err = 0;
	for (uint32_t i = 0; i < fs->nn; i++) {
		const tp_node *n = &fs->m->n[i];
		int rc = add_watch(fs, n->real, "", i, &cap);
		if (i && rc == 0) /* the name under its folder as given: that folder resolved is the parent's */
			rc = add_watch(fs, fs->m->n[n->parent].real, n->name, i, &cap);
		if (i && rc == 0 && strcmp(n->real, n->abspath))
			rc = add_name_watch(fs, n->real, i, &cap);
		if (rc < 0) {
			failed++;
			err = errno;
		}
	}
	if (failed)
		tp_log(0, "cannot watch %zu of %u files and folders (%s%s): changes to them are noticed by size and "
			  "mtime checks on each read only", failed, fs->nn, strerror(err),
		       err == ENOSPC ? "; raise fs.inotify.max_user_watches" : "");
	qsort(fs->w, fs->nw, sizeof *fs->w, cmp_watch);
	fs->watching = start_thread(&fs->watcher, watch_thread, fs) == 0;
}

static void stop_watching(tp_fs *fs)
{
	if (fs->watching) {
		close(fs->stop[1]);
		pthread_join(fs->watcher, NULL);
		close(fs->stop[0]);
	} else if (fs->stop[0] >= 0) {
		close(fs->stop[0]);
		close(fs->stop[1]);
	}
	if (fs->ifd >= 0)
		close(fs->ifd);
	for (size_t k = 0; k < fs->nw; k++)
		free(fs->w[k].name);
	free(fs->w);
	fs->w = NULL;
	fs->nw = 0;
}

/* ---- operations ---- */

static void op_init(void *data, struct fuse_conn_info *conn)
{
	tp_fs *fs = data;
	atomic_store(&fs->ready, 1); /* from here on, cache invalidations reach the kernel */
	conn->want &= ~FUSE_CAP_AUTO_INVAL_DATA; /* files never change while mounted */
	if (conn->capable & FUSE_CAP_ASYNC_READ)
		conn->want |= FUSE_CAP_ASYNC_READ;
	conn->max_background = fs->o->max_background ? fs->o->max_background : 64;
	conn->congestion_threshold = conn->max_background * 3 / 4;
}

static void op_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	tp_fs *fs = fuse_req_userdata(req);
	uint32_t r, i;
	if (parent == FUSE_ROOT_ID) {
		if (strcmp(name, STATS_NAME) == 0 || (fs->cfg_ino && strcmp(name, "config.json") == 0)) {
			reply_entry(req, fs, name[0] == 'c' ? fs->cfg_ino : fs->stats_ino);
			return;
		}
		char *end;
		if (strncmp(name, "rank", 4) == 0 && name[4] >= '0' && name[4] <= '9' &&
		    (name[4] != '0' || name[5] == 0)) {
			unsigned long v = strtoul(name + 4, &end, 10);
			if (*end == 0 && v < fs->T && served(fs, (uint32_t)v)) {
				reply_entry(req, fs, ino_of(fs, (uint32_t)v, 0));
				return;
			}
		}
		fuse_reply_err(req, ENOENT);
		return;
	}
	if (decode(fs, parent, &r, &i) < 0 || fs->m->n[i].kind != TN_DIR) {
		fuse_reply_err(req, ENOTDIR);
		return;
	}
	uint32_t c = tp_node_child(fs->m, i, name);
	if (c == UINT32_MAX)
		fuse_reply_err(req, ENOENT);
	else
		reply_entry(req, fs, ino_of(fs, r, c));
}

static void op_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	(void)fi;
	tp_fs *fs = fuse_req_userdata(req);
	struct stat st;
	uint32_t r, i;
	if (ino != FUSE_ROOT_ID && ino != fs->stats_ino && ino != fs->cfg_ino && decode(fs, ino, &r, &i) < 0) {
		fuse_reply_err(req, ENOENT);
		return;
	}
	fill_attr(fs, ino, &st);
	fuse_reply_attr(req, &st, TIMEOUT);
}

static void op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi)
{
	(void)fi;
	tp_fs *fs = fuse_req_userdata(req);
	scratch *s = get_scratch(size);
	if (!s) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	uint32_t r = 0, i = 0, count;
	int top = ino == FUSE_ROOT_ID;
	if (!top && (decode(fs, ino, &r, &i) < 0 || fs->m->n[i].kind != TN_DIR)) {
		fuse_reply_err(req, ENOTDIR);
		return;
	}
	uint32_t nranks = fs->o->serve ? fs->o->nserve : fs->T, rk = 0;
	count = 2 + (top ? nranks + 1 + (fs->cfg_ino != 0) : fs->m->n[i].nchild);
	size_t used = 0;
	for (off_t k = off; k < (off_t)count; k++) {
		char name[32];
		const char *nm;
		struct stat st;
		memset(&st, 0, sizeof st);
		fuse_ino_t child;
		if (k < 2) {
			nm = k ? ".." : ".";
			child = ino;
		} else if (top && k - 2 < (off_t)nranks) {
			/* the (k - 2)th served rank */
			for (uint32_t seen = 0, want = (uint32_t)(k - 2); rk < fs->T; rk++)
				if (served(fs, rk) && seen++ == want)
					break;
			snprintf(name, sizeof name, "rank%u", rk);
			nm = name;
			child = ino_of(fs, rk, 0);
			rk = 0;
		} else if (top) {
			nm = k - 2 == (off_t)nranks ? STATS_NAME : "config.json";
			child = k - 2 == (off_t)nranks ? fs->stats_ino : fs->cfg_ino;
		} else {
			uint32_t c = fs->m->n[i].child[k - 2];
			nm = fs->m->n[c].name;
			child = ino_of(fs, r, c);
		}
		fill_attr(fs, child, &st);
		size_t l = fuse_add_direntry(req, (char *)s->buf + used, size - used, nm, &st, k + 1);
		if (l > size - used)
			break;
		used += l;
	}
	fuse_reply_buf(req, (char *)s->buf, used);
}

static char *stats_text(tp_fs *fs, size_t *len);

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
	const tp_gather *backend = &tp_gather_cpu_backend;
	if ((fs->backend == TP_BACKEND_CUDA && nsrc > 1) ||
	    (fs->backend == TP_BACKEND_CUDA_PAST && nsrc >= fs->o->cuda_min_runs && want >= fs->o->cuda_min_bytes)) {
		backend = &fs->gpu;
		iov_ok = 0;
	}
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
	while (done < want) {
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

static void op_statfs(fuse_req_t req, fuse_ino_t ino)
{
	(void)ino;
	tp_fs *fs = fuse_req_userdata(req);
	struct statvfs sv;
	memset(&sv, 0, sizeof sv);
	sv.f_bsize = sv.f_frsize = 4096;
	uint64_t total = 0;
	for (uint32_t i = 0; i < fs->nn; i++)
		for (uint32_t r = 0; r < fs->T && fs->m->n[i].kind != TN_DIR; r++)
			total += served(fs, r) ? tp_node_size(fs->m, i, r) : 0;
	sv.f_blocks = total / 4096 + 1;
	sv.f_files = (fsfilcnt_t)fs->nn * fs->T + 2;
	sv.f_namemax = 255;
	sv.f_flag = ST_RDONLY;
	fuse_reply_statfs(req, &sv);
}

/* Everything that would write gets EROFS (the mount is also "ro" for the VFS). */
static void op_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *a, int to_set, struct fuse_file_info *fi)
{
	(void)ino, (void)a, (void)to_set, (void)fi;
	fuse_reply_err(req, EROFS);
}
static void op_mknod(fuse_req_t req, fuse_ino_t p, const char *n, mode_t m, dev_t d)
{
	(void)p, (void)n, (void)m, (void)d;
	fuse_reply_err(req, EROFS);
}
static void op_mkdir(fuse_req_t req, fuse_ino_t p, const char *n, mode_t m)
{
	(void)p, (void)n, (void)m;
	fuse_reply_err(req, EROFS);
}
static void op_unlink(fuse_req_t req, fuse_ino_t p, const char *n)
{
	(void)p, (void)n;
	fuse_reply_err(req, EROFS);
}
static void op_symlink(fuse_req_t req, const char *l, fuse_ino_t p, const char *n)
{
	(void)l, (void)p, (void)n;
	fuse_reply_err(req, EROFS);
}
static void op_rename(fuse_req_t req, fuse_ino_t p, const char *n, fuse_ino_t np, const char *nn, unsigned f)
{
	(void)p, (void)n, (void)np, (void)nn, (void)f;
	fuse_reply_err(req, EROFS);
}
static void op_link(fuse_req_t req, fuse_ino_t i, fuse_ino_t np, const char *nn)
{
	(void)i, (void)np, (void)nn;
	fuse_reply_err(req, EROFS);
}
static void op_write(fuse_req_t req, fuse_ino_t i, const char *b, size_t s, off_t o, struct fuse_file_info *fi)
{
	(void)i, (void)b, (void)s, (void)o, (void)fi;
	fuse_reply_err(req, EROFS);
}
static void op_create(fuse_req_t req, fuse_ino_t p, const char *n, mode_t m, struct fuse_file_info *fi)
{
	(void)p, (void)n, (void)m, (void)fi;
	fuse_reply_err(req, EROFS);
}
static void op_setxattr(fuse_req_t req, fuse_ino_t i, const char *n, const char *v, size_t s, int f)
{
	(void)i, (void)n, (void)v, (void)s, (void)f;
	fuse_reply_err(req, EROFS);
}
static void op_removexattr(fuse_req_t req, fuse_ino_t i, const char *n)
{
	(void)i, (void)n;
	fuse_reply_err(req, EROFS);
}
static void op_getxattr(fuse_req_t req, fuse_ino_t i, const char *n, size_t s)
{
	(void)i, (void)n, (void)s;
	fuse_reply_err(req, ENODATA);
}
static void op_listxattr(fuse_req_t req, fuse_ino_t i, size_t s)
{
	(void)i;
	if (s == 0)
		fuse_reply_xattr(req, 0);
	else
		fuse_reply_buf(req, NULL, 0);
}

static const struct fuse_lowlevel_ops ops = {
	.init = op_init,
	.lookup = op_lookup,
	.getattr = op_getattr,
	.readdir = op_readdir,
	.open = op_open,
	.release = op_release,
	.read = op_read,
	.statfs = op_statfs,
	.setattr = op_setattr,
	.mknod = op_mknod,
	.mkdir = op_mkdir,
	.unlink = op_unlink,
	.rmdir = op_unlink,
	.symlink = op_symlink,
	.rename = op_rename,
	.link = op_link,
	.write = op_write,
	.create = op_create,
	.setxattr = op_setxattr,
	.removexattr = op_removexattr,
	.getxattr = op_getxattr,
	.listxattr = op_listxattr,
};

/* ---- counters ---- */

/* The stats file's size: its text is padded to it, so that stat tells exactly what a read gives
 * (tar, du and cp see the whole file) however the counters grow: a bound on the header lines
 * (the source path, the plan's origin, the readahead and gather notes) and 128 bytes a rank. */
static size_t stats_size(const tp_fs *fs)
{
	return 512 + strlen(fs->m->src) + strlen(fs->m->plan_origin) + RA_NOTE + sizeof fs->gather_note +
	       (size_t)(fs->o->serve ? fs->o->nserve : fs->T) * 128;
}

static char *stats_text(tp_fs *fs, size_t *len)
{
	size_t cap = stats_size(fs);
	char *b = malloc(cap);
	if (!b)
		return NULL;
	size_t w = (size_t)snprintf(b, cap,
				    "tpfs %s\nsource: %s\ntp: %u\nplan: %s\nreadahead: %s\ngather: %s\n"
				    "%-6s %16s %16s %10s %10s %10s\n",
				    TPFS_VERSION, fs->m->src, fs->T, fs->m->plan_origin, fs->ra_note, fs->gather_note, "rank",
				    "bytes_served", "source_bytes", "reads", "copied", "gpu");
	for (uint32_t r = 0; r < fs->T && w < cap; r++)
		if (served(fs, r))
			w += (size_t)snprintf(b + w, cap - w, "%-6u %16llu %16llu %10llu %10llu %10llu\n", r,
				      (unsigned long long)atomic_load(&fs->rs[r].served),
				      (unsigned long long)atomic_load(&fs->rs[r].touched),
				      (unsigned long long)atomic_load(&fs->rs[r].reads),
				      (unsigned long long)atomic_load(&fs->rs[r].copied),
				      (unsigned long long)atomic_load(&fs->rs[r].gpu));
	if (w > cap - 1)
		w = cap - 1;
	memset(b + w, ' ', cap - 1 - w); /* padded with spaces to the size stat gives */
	b[cap - 1] = '\n';
	*len = cap;
	return b;
}

/* ---- mounting ---- */

/* Is the filesystem with device number dev still mounted at mnt? (Without touching the mount.) */
static int is_mounted(const char *mnt, dev_t dev)
{
	FILE *f = fopen("/proc/self/mountinfo", "r");
	char line[8192], want[32];
	int hit = 0;
	snprintf(want, sizeof want, " %u:%u ", major(dev), minor(dev));
	while (f && !hit && fgets(line, sizeof line, f))
		hit = strstr(line, want) && strstr(line, mnt);
	if (f)
		fclose(f);
	return hit;
}

/* Raises the mount's readahead window so that reads arrive as 1 MiB requests. */
static void set_readahead(tp_fs *fs, dev_t dev)
{
	unsigned kb = fs->o->readahead_kb;
	if (!kb) {
		snprintf(fs->ra_note, RA_NOTE, "left at the kernel's default (--readahead 0)");
		return;
	}
	char path[128];
	snprintf(path, sizeof path, "/sys/class/bdi/%u:%u/read_ahead_kb", major(dev), minor(dev));
	FILE *f = fopen(path, "w");
	int ok = f && fprintf(f, "%u\n", kb) > 0;
	if (f && fclose(f) != 0)
		ok = 0;
	if (ok) {
		snprintf(fs->ra_note, RA_NOTE, "%u KiB (bdi %u:%u)", kb, major(dev), minor(dev));
		tp_log(1, "readahead of %s set to %u KiB (bdi %u:%u)", fs->o->mnt, kb, major(dev), minor(dev));
	} else if (errno == ENOENT && !is_mounted(fs->o->mnt, dev)) {
		/* unmounted already (a mount used for a moment): nothing to tune */
		tp_fmt(fs->ra_note, RA_NOTE, "not set (unmounted before it could be)");
	} else {
		tp_fmt(fs->ra_note, RA_NOTE, "kernel default (could not write %s: %s)", path, strerror(errno));
		tp_log(0, "could not set the readahead of %s (%s: %s): reads arrive in smaller requests", fs->o->mnt,
		       path, strerror(errno));
	}
}

/* Background mode: the socket (SOCK_SEQPACKET) to the waiting parent. The ready helper sends
 * "O" (ready) or "E<reason>"; the daemon, when it fails before or while the parent waits,
 * "D<reason>" with the first error it logged. Sends never raise SIGPIPE. */

static void send_note(int fd, const char *msg)
{
	if (fd >= 0 && send(fd, msg, strlen(msg), MSG_NOSIGNAL) < 0 && errno != EPIPE)
		tp_log(0, "could not report to the waiting parent: %s", strerror(errno));
}

/* Background mode, once ready: stdio goes to /dev/null, the log to the --log file or syslog. */
static void detach_stdio(const char *log_path)
{
	int nul = open("/dev/null", O_RDWR);
	if (nul < 0)
		return;
	if (log_path) {
		log_file = fopen(log_path, "a");
		if (!log_file)
			tp_log(0, "cannot open log %s: %s; logging to syslog", log_path, strerror(errno));
	}
	if (!log_file) {
		openlog("tpfs", LOG_PID, LOG_DAEMON);
		log_syslog = 1;
	}
	dup2(nul, 0);
	dup2(nul, 1);
	dup2(nul, 2);
	if (nul > 2)
		close(nul);
	if (chdir("/") < 0)
		tp_log(0, "chdir /: %s", strerror(errno));
}

/* Runs in a short-lived helper process, never in the daemon: a stat of the mount point blocks
 * until the daemon has answered INIT and the GETATTR, which a thread of the daemon must not wait
 * for itself (under valgrind a stat holds the scheduler lock and the daemon would never answer).
 * Then it raises the readahead window (only effective after INIT) and reports readiness to the
 * waiting parent in background mode. Exits without running atexit handlers. */
static void ready_helper(tp_fs *fs, int report_fd)
{
	struct stat st;
	char msg[512];
	/* Not a holder of the FUSE connection: when the daemon goes away (or quits without
	 * answering, as libfuse does with requests read after exit), the connection ends and this
	 * stat with it, instead of waiting for ever on a connection it keeps open itself. */
	close(fuse_session_fd(fs->se));
	close(fs->inval[0]); /* nor of the invalidation pipe: its end is how the thread learns to stop */
	close(fs->inval[1]);
	if (stat(fs->o->mnt, &st) < 0) {
		snprintf(msg, sizeof msg, "E%s: the new mount does not answer: %s", fs->o->mnt, strerror(errno));
	} else {
		set_readahead(fs, st.st_dev);
		snprintf(msg, sizeof msg, "O");
		char set[96] = "";
		if (fs->o->serve) { /* the served set, as ranges: "ranks 8-15 of" */
			size_t k = (size_t)snprintf(set, sizeof set, "ranks ");
			for (uint32_t r = 0; r < fs->T; r++) {
				if (!fs->o->serve[r] || (r && fs->o->serve[r - 1]))
					continue;
				uint32_t end = r;
				while (end + 1 < fs->T && fs->o->serve[end + 1])
					end++;
				if (k > sizeof set - 32) { /* a long list is cut short */
					k += (size_t)snprintf(set + k, sizeof set - k, ",...");
					break;
				}
				k += (size_t)(end > r ? snprintf(set + k, sizeof set - k, "%s%u-%u", k > 6 ? "," : "", r, end)
						      : snprintf(set + k, sizeof set - k, "%s%u", k > 6 ? "," : "", r));
			}
			snprintf(set + k, sizeof set - k, " of ");
		}
		tp_log(1, "serving %s as %s%u ranks at %s (plan: %s)", fs->m->src, set, fs->T, fs->o->mnt,
		       fs->m->plan_origin);
	}
	send_note(report_fd, msg);
	_exit(msg[0] == 'O' ? 0 : 1);
}

/* Parent side of daemonizing: waits for the verdict: the helper's "O" (ready), or a failure,
 * preferring the daemon's own reason ("D") to the helper's view of it ("E": the mount does not
 * answer), until both have closed their ends. */
static int wait_child(int fd, tp_err *e)
{
	char buf[TP_ERR_MSG + 8], helper_msg[TP_ERR_MSG + 8] = "";
	struct timespec t0, now;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	int waited_out = 0;
	for (;;) {
		clock_gettime(CLOCK_MONOTONIC, &now);
		long left = 120 * 1000 - ((now.tv_sec - t0.tv_sec) * 1000 + (now.tv_nsec - t0.tv_nsec) / 1000000);
		struct pollfd pfd = {.fd = fd, .events = POLLIN};
		int n = left > 0 ? poll(&pfd, 1, (int)left) : 0;
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			waited_out = n == 0;
			break;
		}
		ssize_t got = recv(fd, buf, sizeof buf - 1, 0);
		if (got <= 0)
			break; /* both ends closed */
		buf[got] = 0;
		if (buf[0] == 'O') {
			close(fd);
			return 0;
		}
		if (buf[0] == 'D') {
			close(fd);
			return tp_fail(e, TP_EIO, "%s", buf + 1);
		}
		if (buf[0] == 'E' && !helper_msg[0])
			snprintf(helper_msg, sizeof helper_msg, "%s", buf + 1);
	}
	close(fd);
	if (helper_msg[0])
		return tp_fail(e, TP_EIO, "%s", helper_msg);
	return tp_fail(e, TP_EIO, "the daemon did not report a ready mount%s", waited_out ? " within 120 s" : "");
}

/* Opens the gather backend o->gather asks for, in the daemon (after it forked). */
static int open_backend(tp_fs *fs, tp_err *e)
{
	const tp_fs_opts *o = fs->o;
	fs->backend = TP_BACKEND_CPU;
	tp_fmt(fs->gather_note, sizeof fs->gather_note, "%s", o->gather == TP_GATHER_CPU ? "cpu (--gather cpu)"
	       : "cpu (auto: no measured range where CUDA wins is set; see docs/PERFORMANCE.md)");
	if (o->gather == TP_GATHER_CUDA || (o->gather == TP_GATHER_AUTO && o->cuda_min_runs && o->cuda_min_bytes)) {
		char why[256];
		if (tp_cuda_load(&fs->gpu, why, sizeof why) == 0) {
			fs->backend = o->gather == TP_GATHER_CUDA ? TP_BACKEND_CUDA : TP_BACKEND_CUDA_PAST;
			tp_fmt(fs->gather_note, sizeof fs->gather_note, "cuda on %s (%s)", why,
			       fs->backend == TP_BACKEND_CUDA ? "every strided gather" : "past --cuda-min-runs/--cuda-min-bytes");
		} else if (o->gather == TP_GATHER_CUDA) {
			return tp_fail(e, TP_EIO, "--gather cuda: %s", why);
		} else {
			tp_fmt(fs->gather_note, sizeof fs->gather_note, "cpu (auto: %s)", why);
		}
	}
	tp_log(1, "gather: %s", fs->gather_note);
	return 0;
}

static void scratch_key_make(void)
{
	pthread_key_create(&scratch_key, scratch_free);
}

/* Mounts and serves; every resource is released in the reverse order of its acquisition, one
 * label per resource (the shape of libfuse's passthrough_ll.c). */
int tp_fs_main(tp_model *m, const tp_fs_opts *o, int *parent, tp_err *e)
{
	static pthread_once_t key_once = PTHREAD_ONCE_INIT;
	*parent = 0;
	tp_fs fs;
	memset(&fs, 0, sizeof fs);
	fs.m = m;
	pthread_mutex_init(&fs.fh_lock, NULL);
	fs.o = o;
	fs.nn = m->nn;
	fs.T = m->T;
	fs.stats_ino = 2 + (fuse_ino_t)m->T * m->nn;
	fs.cfg_ino = m->config_text ? fs.stats_ino + 1 : 0;
	fs.ifd = fs.stop[0] = fs.stop[1] = fs.inval[0] = fs.inval[1] = -1;
	clock_gettime(CLOCK_REALTIME, &fs.started);
	int rc = -1;
	pid_t helper = -1;
	int lock_closed = 0;
	char opts[4096];
	char *argv[] = {"tpfs", "-o", opts, o->debug ? "-d" : NULL, NULL};
	struct fuse_args args = FUSE_ARGS_INIT(o->debug ? 4 : 3, argv);

	fs.ra_note = mmap(NULL, RA_NOTE, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (fs.ra_note == MAP_FAILED)
		return tp_fail(e, TP_ENOMEM, "mmap: %s", strerror(errno));
	snprintf(fs.ra_note, RA_NOTE, "not set yet");
	fs.hdr = calloc((size_t)m->nn * m->T, sizeof *fs.hdr);
	if (!fs.hdr) {
		tp_fail(e, TP_ENOMEM, "out of memory");
		goto out_ra;
	}
	fs.ns = calloc(m->nn, sizeof *fs.ns);
	if (!fs.ns) {
		tp_fail(e, TP_ENOMEM, "out of memory");
		goto out_hdr;
	}
	for (uint32_t i = 0; i < m->nn; i++) {
		atomic_init(&fs.ns[i].ctime, ts_ns(m->n[i].ctime));
		atomic_init(&fs.ns[i].mode, (uint32_t)m->n[i].mode);
		atomic_init(&fs.ns[i].uid, (uint32_t)m->n[i].uid);
		atomic_init(&fs.ns[i].gid, (uint32_t)m->n[i].gid);
		if (m->n[i].kind == TN_TENSORS && m->n[i].map && o->source_io == 0) /* no marks: checked each time */
			fs.ns[i].resid = calloc((m->n[i].src_size + RC_CHUNK - 1) / RC_CHUNK + 1, sizeof *fs.ns[i].resid);
	}
	fs.rs = calloc(m->T, sizeof *fs.rs);
	if (!fs.rs) {
		tp_fail(e, TP_ENOMEM, "out of memory");
		goto out_ns;
	}
	fs.win = calloc((size_t)m->nn * m->T, sizeof *fs.win);
	if (!fs.win) {
		tp_fail(e, TP_ENOMEM, "out of memory");
		goto out_rs;
	}
	pthread_once(&key_once, scratch_key_make);

	if (!o->foreground) {
		/* Fork before libfuse holds anything: the child mounts and serves; this process waits
		 * for its verdict (ready, or the reason it is not) and returns. */
		int pipefd[2];
		if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pipefd) < 0) {
			tp_fail(e, TP_EIO, "socketpair: %s", strerror(errno));
			goto out_win;
		}
		fflush(NULL);
		pid_t pid = fork();
		if (pid != 0) {
			close(pipefd[1]);
			if (pid < 0) {
				close(pipefd[0]);
				tp_fail(e, TP_EIO, "fork: %s", strerror(errno));
				goto out_win;
			}
			*parent = 1;
			if (o->mnt_lock >= 0)
				close(o->mnt_lock); /* the child holds the lock until its mount exists */
			rc = wait_child(pipefd[0], e);
			goto out_win;
		}
		close(pipefd[0]);
		setsid();
		daemon_fd = pipefd[1];
	}
	fuse_set_log_func(log_fuse);

	/* The user's options first, then ours: a later option wins, so "-o rw" cannot undo "ro".
	 * default_permissions always (the kernel checks the source's owner and mode bits);
	 * allow_other only when asked for. */
	if (snprintf(opts, sizeof opts, "%s%sro,fsname=tpfs,subtype=tpfs,default_permissions",
		     o->fuse_opts ? o->fuse_opts : "", o->fuse_opts ? "," : "") >= (int)sizeof opts) {
		/* cut short, ours would be lost: a mount without ro or default_permissions */
		tp_fail(e, TP_EINVAL, "-o: the mount options are too long (at most %zu characters)",
			sizeof opts - sizeof ",ro,fsname=tpfs,subtype=tpfs,default_permissions");
		goto out_report;
	}
	fs.se = fuse_session_new(&args, &ops, sizeof ops, &fs);
	if (!fs.se) {
		tp_fail(e, TP_EINVAL, "libfuse refused the mount options '%s'", opts);
		goto out_report;
	}
	/* the handlers before the mount: a SIGTERM from the moment the mount exists ends the loop
	 * (and unmounts) instead of killing the daemon with the mount left behind */
	if (fuse_set_signal_handlers(fs.se) != 0) {
		tp_fail(e, TP_EIO, "cannot install signal handlers");
		goto out_session;
	}
	int mounted = fuse_session_mount(fs.se, o->mnt) == 0;
	if (o->mnt_lock >= 0) { /* the mount exists (or failed): another tpfs may now look */
		close(o->mnt_lock);
		lock_closed = 1;
	}
	if (!mounted) {
		tp_fail(e, TP_EIO, "%s: mounting failed (see the message above; is /dev/fuse usable?)", o->mnt);
		goto out_signals;
	}
	tp_guard_install();
	if (start_inval(&fs) < 0) {
		tp_fail(e, TP_EIO, "cannot start the invalidation thread: %s", strerror(errno));
		goto out_unmount;
	}

	fflush(NULL);
	helper = fork();
	if (helper == 0)
		ready_helper(&fs, daemon_fd);
	if (helper < 0) {
		tp_fail(e, TP_EIO, "fork: %s", strerror(errno));
		goto out_inval;
	}
	if (daemon_fd >= 0) /* the helper reports readiness to the parent; the daemon's output goes to the log */
		detach_stdio(o->log_path);
	if (open_backend(&fs, e) < 0)
		goto out_helper;
	advise_sources(&fs);
	start_watching(&fs);
	struct fuse_loop_config *lc = fuse_loop_cfg_create();
	fuse_loop_cfg_set_max_threads(lc, o->threads ? o->threads : 16);
	fuse_loop_cfg_set_idle_threads(lc, o->threads ? o->threads : 16);
	int lr = fuse_session_loop_mt(fs.se, lc);
	fuse_loop_cfg_destroy(lc);
	stop_watching(&fs);
	if (lr < 0) {
		tp_fail(e, TP_EIO, "the FUSE loop failed: %s", strerror(-lr));
	} else {
		rc = 0;
		if (o->debug) {
			size_t len;
			char *t = stats_text(&fs, &len);
			if (t)
				tp_log(3, "counters at unmount:\n%s", t);
			free(t);
		}
	}
	if (fs.gpu.ops)
		fs.gpu.ops->destroy(fs.gpu.self);
out_helper:
	if (waitpid(helper, NULL, WNOHANG) == 0) /* still waiting for a mount that is going away */
		kill(helper, SIGKILL); /* reaped once the connection has ended (its stat may wait on it) */
	else
		helper = -1;
out_inval:
	stop_inval(&fs);
out_unmount:
	fuse_session_unmount(fs.se);
out_signals:
	fuse_remove_signal_handlers(fs.se);
out_session:
	fuse_session_destroy(fs.se);
	if (helper > 0)
		waitpid(helper, NULL, 0);
out_report:
	if (o->mnt_lock >= 0 && !lock_closed && !*parent)
		close(o->mnt_lock);
	if (rc < 0 && !o->foreground) {
		/* the log, and the parent if it still waits: the reason and the first error logged */
		char msg[TP_ERR_MSG + 8];
		int fe = first_error[0] && !strstr(e->msg, first_error);
		tp_fmt(msg, sizeof msg, "D%s%s%s%s", e->msg, fe ? " (" : "", fe ? first_error : "", fe ? ")" : "");
		tp_log(2, "%s", msg + 1);
		send_note(daemon_fd, msg);
	}
	if (daemon_fd >= 0) {
		close(daemon_fd);
		daemon_fd = -1;
	}
	fuse_opt_free_args(&args);
	if (log_file)
		fclose(log_file);
	log_file = NULL;
	while (fs.open_fh) { /* no request runs any more: what no RELEASE reached */
		fhandle *h = fs.open_fh;
		fs.open_fh = h->next;
		fh_free(h);
	}
out_win:
	free((void *)fs.win);
out_rs:
	free(fs.rs);
out_ns:
	for (uint32_t i = 0; i < m->nn; i++)
		free((void *)fs.ns[i].resid);
	free(fs.ns);
out_hdr:
	for (size_t k = 0; k < (size_t)m->nn * m->T; k++)
		free(atomic_load(&fs.hdr[k]));
	free(fs.hdr);
out_ra:
	munmap(fs.ra_note, RA_NOTE);
	return rc;
}
