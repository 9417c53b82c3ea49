/* fs.c: the FUSE low-level filesystem over a tp_model.
 *
 * Inodes are computed, never allocated: 1 is the top folder, 2 + r * nn + i is node i of the
 * model as rank r sees it (node 0 is the rank folder), and 2 + T * nn is .tpfs-stats. Every
 * inode lives as long as the mount, so lookup counts are not tracked.
 *
 * Read path (no allocation, no parsing, no name lookup per request): decode the inode, check
 * that the source has not changed (one fstat), map the range to runs (tp_map), and reply with
 * an iovec that points into the read-only mapping of the source, the rank's header bytes and a
 * static zero page. The kernel copies from the mapping, so a truncated source gives EFAULT
 * there, not SIGBUS here. When the runs are too many or too small for an iovec, they are copied
 * into a per-thread buffer under a SIGBUS guard. Attributes and entries are cached for a long
 * time and file pages are kept across opens (keep_cache): the files never change while
 * mounted; a source that does change makes its rank files fail with EIO.
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
#include <sys/inotify.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <syslog.h>
#include <time.h>
#include <unistd.h>

#include "gather.h"
#include "gather_module.h"
#include "guard.h"

#define TIMEOUT (365.0 * 24 * 3600) /* entry and attribute cache lifetime, seconds */
#define RUN_CAP 4096                /* runs mapped per pass */
#define IOV_CAP 1000                /* segments in one iovec reply (below IOV_MAX) */
#define SMALL_RUN 2048              /* average run below which copying beats an iovec */
#define STATS_NAME ".tpfs-stats"
#define RA_NOTE 256                 /* bytes of the shared readahead note */

/* ---- logging ---- */

int tp_log_debug;
static int log_syslog;
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
	if (log_syslog) {
		static const int prio[] = {LOG_WARNING, LOG_INFO, LOG_ERR, LOG_DEBUG};
		syslog(prio[level], "%s", msg);
		return;
	}
	FILE *f = log_file ? log_file : stderr;
	fprintf(f, "tpfs: %s: %s\n", names[level], msg);
	fflush(f);
}

void tp_log_model(void *ctx, int level, const char *msg)
{
	(void)ctx;
	tp_log(level, "%s", msg);
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

typedef struct tp_fs {
	tp_model *m;
	const tp_fs_opts *o;
	struct fuse_session *se;
	uint32_t nn, T;
	fuse_ino_t stats_ino;
	fuse_ino_t cfg_ino;         /* MNT/config.json (the source's), or 0 when there is none */
	_Atomic(char *) *hdr;  /* [i * T + r]: local header bytes, made on first use */
	_Atomic int *bad;      /* [i]: the source changed; reads fail with EIO */
	rank_stats *rs;        /* [r] */
	struct timespec started;
	char *ra_note;         /* what was done about readahead (shared with the helper process) */
	_Atomic int ready;
	/* source watching */
	int ifd;               /* inotify descriptor, or -1 */
	int stop[2];           /* closing stop[1] ends the watcher */
	struct watch *w;       /* (watch descriptor, file name) -> node */
	size_t nw;
	pthread_t watcher;
	int watching;
	/* gather backends */
	tp_gather gpu;         /* the CUDA backend when loaded */
	int gpu_mode;          /* 0 CPU only, 1 CUDA for every strided gather, 2 CUDA past thresholds */
	char gather_note[256];
} tp_fs;

typedef struct watch {
	int wd;
	char *name;
	uint32_t node;
} watch;

/* A handle of an open plain file or of the stats file. */
typedef struct fhandle {
	int fd;
	char *buf; /* stats: the text */
	size_t len;
} fhandle;

static const uint8_t zero_page[1 << 20];

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
	return 0;
}

static void fill_attr(const tp_fs *fs, fuse_ino_t ino, struct stat *st)
{
	memset(st, 0, sizeof *st);
	st->st_ino = ino;
	st->st_uid = getuid();
	st->st_gid = getgid();
	st->st_blksize = 1 << 20;
	uint32_t r, i;
	if (ino == FUSE_ROOT_ID) {
		st->st_mode = S_IFDIR | 0555;
		st->st_nlink = 2 + fs->T;
		st->st_size = 4096;
		st->st_mtim = fs->m->n[0].mtime;
	} else if (ino == fs->stats_ino) {
		st->st_mode = S_IFREG | 0444;
		st->st_nlink = 1;
		st->st_size = 0; /* generated on open, read with direct_io */
		st->st_mtim = fs->started;
	} else if (ino == fs->cfg_ino) {
		st->st_mode = S_IFREG | 0444;
		st->st_nlink = 1;
		st->st_size = (off_t)fs->m->config_len;
		st->st_mtim = fs->m->n[fs->m->config_node].mtime;
	} else if (decode(fs, ino, &r, &i) == 0) {
		const tp_node *n = &fs->m->n[i];
		st->st_mtim = n->mtime;
		if (n->kind == TN_DIR) {
			st->st_mode = S_IFDIR | 0555;
			st->st_nlink = 2;
			for (uint32_t k = 0; k < n->nchild; k++)
				st->st_nlink += fs->m->n[n->child[k]].kind == TN_DIR;
			st->st_size = 4096;
		} else {
			st->st_mode = S_IFREG | 0444;
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

/* Marks node i's source as changed: logs once, and drops every rank's cached pages of it so
 * that later reads reach the daemon and fail with EIO instead of returning stale bytes. */
static void mark_bad(tp_fs *fs, uint32_t i, const char *why)
{
	if (atomic_exchange(&fs->bad[i], 1))
		return;
	tp_log(2, "%s: the source changed since it was mounted (%s); its rank files now fail with EIO "
		  "(remount to serve the new version)", fs->m->n[i].path, why);
	if (fs->se && atomic_load(&fs->ready))
		for (uint32_t r = 0; r < fs->T; r++)
			fuse_lowlevel_notify_inval_inode(fs->se, ino_of(fs, r, i), 0, 0);
}

/* Does the file behind fd (or, with fd < 0, behind node i's path) differ from what was planned? */
static int differs(const tp_node *n, int fd, char *why, size_t len)
{
	struct stat st;
	if ((fd >= 0 ? fstat(fd, &st) : stat(n->abspath, &st)) < 0) {
		tp_fmt(why, len, "%s", strerror(errno));
		return 1;
	}
	if ((uint64_t)st.st_size != n->src_size)
		tp_fmt(why, len, "size %llu, was %llu", (unsigned long long)st.st_size, (unsigned long long)n->src_size);
	else if (st.st_mtim.tv_sec != n->mtime.tv_sec || st.st_mtim.tv_nsec != n->mtime.tv_nsec)
		tp_fmt(why, len, "modified");
	else if (st.st_ino != n->ino || st.st_dev != n->dev)
		tp_fmt(why, len, "replaced by another file");
	else
		return 0;
	return 1;
}

/* Has the source of node i changed since it was planned? One fstat of the open source. */
static int source_changed(tp_fs *fs, uint32_t i, int fd)
{
	if (atomic_load(&fs->bad[i]))
		return 1;
	char why[96];
	if (!differs(&fs->m->n[i], fd, why, sizeof why))
		return 0;
	mark_bad(fs, i, why);
	return 1;
}

/* ---- watching sources (inotify) ---- */

static void recheck_all(tp_fs *fs)
{
	for (uint32_t i = 0; i < fs->nn; i++) {
		char why[96];
		if (fs->m->n[i].kind != TN_DIR && !atomic_load(&fs->bad[i]) && differs(&fs->m->n[i], -1, why, sizeof why))
			mark_bad(fs, i, why);
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
			if (ev->mask & (IN_Q_OVERFLOW | IN_DELETE_SELF | IN_MOVE_SELF)) {
				recheck_all(fs);
				continue;
			}
			if (!ev->len)
				continue;
			for (size_t k = 0; k < fs->nw; k++) {
				if (fs->w[k].wd != ev->wd || strcmp(fs->w[k].name, ev->name) != 0)
					continue;
				const char *what = ev->mask & (IN_MOVED_TO | IN_CREATE) ? "replaced"
						   : ev->mask & (IN_DELETE | IN_MOVED_FROM) ? "removed or renamed"
						   : ev->mask & IN_ATTRIB ? "attributes changed" : "modified";
				mark_bad(fs, fs->w[k].node, what);
			}
		}
	}
	return NULL;
}

static void add_watch(tp_fs *fs, const char *path, uint32_t node, size_t *cap)
{
	char *d = strdup(path), *b = strdup(path);
	if (!d || !b)
		goto out;
	const uint32_t mask = IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE |
			      IN_DELETE | IN_DELETE_SELF | IN_MOVE_SELF;
	int wd = inotify_add_watch(fs->ifd, dirname(d), mask);
	if (wd < 0)
		goto out;
	const char *name = basename(b);
	for (size_t k = 0; k < fs->nw; k++)
		if (fs->w[k].wd == wd && fs->w[k].node == node && !strcmp(fs->w[k].name, name))
			goto out;
	if (fs->nw == *cap) {
		size_t nc = *cap ? *cap * 2 : 64;
		watch *nw = realloc(fs->w, nc * sizeof *nw);
		if (!nw)
			goto out;
		fs->w = nw;
		*cap = nc;
	}
	fs->w[fs->nw].wd = wd;
	fs->w[fs->nw].node = node;
	fs->w[fs->nw].name = strdup(name);
	if (fs->w[fs->nw].name)
		fs->nw++;
out:
	free(d);
	free(b);
}

/* Watches the folder of every source file (and of the file a symbolic link leads to, as in a
 * Hugging Face cache) so that a change marks the file at once, cached pages included. */
static void start_watching(tp_fs *fs)
{
	fs->ifd = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
	if (fs->ifd < 0 || pipe(fs->stop) < 0) {
		tp_log(0, "cannot watch the sources (%s): changes are noticed by size and mtime checks only", strerror(errno));
		return;
	}
	size_t cap = 0;
	for (uint32_t i = 0; i < fs->nn; i++) {
		const tp_node *n = &fs->m->n[i];
		if (n->kind == TN_DIR)
			continue;
		add_watch(fs, n->abspath, i, &cap);
		char *real = realpath(n->abspath, NULL);
		if (real && strcmp(real, n->abspath))
			add_watch(fs, real, i, &cap);
		free(real);
	}
	fs->watching = pthread_create(&fs->watcher, NULL, watch_thread, fs) == 0;
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
			if (*end == 0 && v < fs->T) {
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
	count = 2 + (top ? fs->T + 1 + (fs->cfg_ino != 0) : fs->m->n[i].nchild);
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
		} else if (top && k - 2 < (off_t)fs->T) {
			snprintf(name, sizeof name, "rank%u", (unsigned)(k - 2));
			nm = name;
			child = ino_of(fs, (uint32_t)(k - 2), 0);
		} else if (top) {
			nm = k - 2 == (off_t)fs->T ? STATS_NAME : "config.json";
			child = k - 2 == (off_t)fs->T ? fs->stats_ino : fs->cfg_ino;
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
	if ((fi->flags & O_ACCMODE) != O_RDONLY || (fi->flags & (O_TRUNC | O_APPEND))) {
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
		h->fd = -1;
		fi->fh = (uint64_t)(uintptr_t)h;
		fi->direct_io = 1;
		fuse_reply_open(req, fi);
		return;
	}
	uint32_t r, i;
	if (ino == fs->cfg_ino) { /* MNT/config.json: the source's, served from memory */
		fi->keep_cache = 1;
		if (atomic_load(&fs->bad[fs->m->config_node]))
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
	if (atomic_load(&fs->bad[i])) {
		fuse_reply_err(req, EIO);
		return;
	}
	if (n->kind == TN_PLAIN) {
		fhandle *h = calloc(1, sizeof *h);
		if (!h) {
			fuse_reply_err(req, ENOMEM);
			return;
		}
		h->fd = open(n->abspath, O_RDONLY | O_CLOEXEC);
		if (h->fd < 0 || source_changed(fs, i, h->fd)) {
			int err = h->fd < 0 ? errno : EIO;
			if (h->fd >= 0)
				close(h->fd);
			free(h);
			fuse_reply_err(req, err);
			return;
		}
		fi->fh = (uint64_t)(uintptr_t)h;
	}
	fuse_reply_open(req, fi);
}

static void op_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	(void)ino;
	fhandle *h = (fhandle *)(uintptr_t)fi->fh;
	if (h) {
		if (h->fd >= 0)
			close(h->fd);
		free(h->buf);
		free(h);
	}
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
	if (source_changed(fs, i, n->fd)) {
		fuse_reply_err(req, EIO);
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
	int iov_ok = cov == want && nr <= IOV_CAP && (nr <= 8 || want / nr >= SMALL_RUN);
	if (fs->o->reply)
		iov_ok = cov == want && nr <= IOV_CAP && fs->o->reply == 1;
	const tp_gather *backend = &tp_gather_cpu_backend;
	if (fs->gpu_mode) {
		size_t nsrc = 0;
		for (size_t k = 0; k < nr; k++)
			nsrc += s->runs[k].kind == TP_RUN_SRC;
		if (cov < want)
			nsrc = RUN_CAP; /* more runs than one pass maps */
		if ((fs->gpu_mode == 1 && nsrc > 1) ||
		    (fs->gpu_mode == 2 && nsrc >= fs->o->cuda_min_runs && want >= fs->o->cuda_min_bytes)) {
			backend = &fs->gpu;
			iov_ok = 0;
		}
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
		if (!cov || tp_guarded_gather(backend, s->runs, nr, &src, hdr, s->buf + done, &ge) < 0) {
			if (ge.code == TP_ECHANGED)
				mark_bad(fs, i, "shrank under its mapping");
			else
				tp_log(2, "%s (rank %u): gather failed: %s", n->path, r, ge.msg);
			fuse_reply_err(req, EIO);
			return;
		}
		release_runs(fs, n, s->runs, nr);
		done += cov;
	}
	atomic_fetch_add_explicit(&rs->served, want, memory_order_relaxed);
	atomic_fetch_add_explicit(&rs->touched, touched, memory_order_relaxed);
	atomic_fetch_add_explicit(&rs->copied, 1, memory_order_relaxed);
	if (backend == &fs->gpu)
		atomic_fetch_add_explicit(&rs->gpu, 1, memory_order_relaxed);
	fuse_reply_buf(req, (const char *)s->buf, want);
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
		if (source_changed(fs, c, -1))
			fuse_reply_err(req, EIO);
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
		if (source_changed(fs, i, -1)) {
			fuse_reply_err(req, EIO);
			return;
		}
		uint64_t len = n->gen_len[r], o = (uint64_t)off < len ? (uint64_t)off : len;
		fuse_reply_buf(req, n->gen[r] + o, size < len - o ? size : len - o);
	} else if (h) {
		scratch *s = get_scratch(size);
		if (!s) {
			fuse_reply_err(req, ENOMEM);
			return;
		}
		if (source_changed(fs, i, h->fd)) {
			fuse_reply_err(req, EIO);
			return;
		}
		ssize_t got = pread(h->fd, s->buf, size, off);
		if (got < 0)
			fuse_reply_err(req, errno);
		else
			fuse_reply_buf(req, (const char *)s->buf, (size_t)got);
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
			total += tp_node_size(fs->m, i, r);
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

static char *stats_text(tp_fs *fs, size_t *len)
{
	size_t cap = 512 + (size_t)fs->T * 128;
	char *b = malloc(cap);
	if (!b)
		return NULL;
	size_t w = (size_t)snprintf(b, cap,
				    "tpfs %s\nsource: %s\ntp: %u\nplan: %s\nreadahead: %s\ngather: %s\n"
				    "%-6s %16s %16s %10s %10s %10s\n",
				    TPFS_VERSION, fs->m->src, fs->T, fs->m->plan_origin, fs->ra_note, fs->gather_note, "rank",
				    "bytes_served", "source_bytes", "reads", "copied", "gpu");
	for (uint32_t r = 0; r < fs->T && w < cap; r++)
		w += (size_t)snprintf(b + w, cap - w, "%-6u %16llu %16llu %10llu %10llu %10llu\n", r,
				      (unsigned long long)atomic_load(&fs->rs[r].served),
				      (unsigned long long)atomic_load(&fs->rs[r].touched),
				      (unsigned long long)atomic_load(&fs->rs[r].reads),
				      (unsigned long long)atomic_load(&fs->rs[r].copied),
				      (unsigned long long)atomic_load(&fs->rs[r].gpu));
	*len = w < cap ? w : cap - 1;
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

/* Background mode: the pipe to the waiting parent, until readiness is reported. */
static int daemon_fd = -1;

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
	if (stat(fs->o->mnt, &st) < 0) {
		snprintf(msg, sizeof msg, "E%s: the new mount does not answer: %s", fs->o->mnt, strerror(errno));
	} else {
		set_readahead(fs, st.st_dev);
		snprintf(msg, sizeof msg, "O");
		tp_log(1, "serving %s as %u ranks at %s (plan: %s)", fs->m->src, fs->T, fs->o->mnt, fs->m->plan_origin);
	}
	if (report_fd >= 0 && write(report_fd, msg, strlen(msg)) < 0)
		tp_log(0, "could not report readiness: %s", strerror(errno));
	_exit(msg[0] == 'O' ? 0 : 1);
}

/* Parent side of daemonizing: waits for the child's verdict. */
static int wait_child(int fd, pid_t pid, tp_err *e)
{
	char buf[512] = {0};
	struct pollfd pfd = {.fd = fd, .events = POLLIN};
	int n = poll(&pfd, 1, 120 * 1000);
	ssize_t got = n > 0 ? read(fd, buf, sizeof buf - 1) : -1;
	close(fd);
	if (got > 0 && buf[0] == 'O')
		return 0;
	if (got > 1)
		return tp_fail(e, TP_EIO, "%s", buf + 1);
	(void)pid;
	return tp_fail(e, TP_EIO, "the daemon did not report a ready mount%s", n == 0 ? " within 120 s" : "");
}

int tp_fs_main(tp_model *m, const tp_fs_opts *o, int *parent, tp_err *e)
{
	*parent = 0;
	tp_fs fs;
	memset(&fs, 0, sizeof fs);
	fs.m = m;
	fs.o = o;
	fs.nn = m->nn;
	fs.T = m->T;
	fs.stats_ino = 2 + (fuse_ino_t)m->T * m->nn;
	fs.cfg_ino = m->config_text ? fs.stats_ino + 1 : 0;
	fs.ifd = fs.stop[0] = fs.stop[1] = -1;
	tp_fmt(fs.gather_note, sizeof fs.gather_note, "%s", !strcmp(o->gather, "cpu") ? "cpu (--gather cpu)"
	       : "cpu (auto: no measured range where CUDA wins is set; see docs/PERFORMANCE.md)");
	clock_gettime(CLOCK_REALTIME, &fs.started);
	fs.ra_note = mmap(NULL, RA_NOTE, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (fs.ra_note == MAP_FAILED)
		return tp_fail(e, TP_ENOMEM, "mmap: %s", strerror(errno));
	snprintf(fs.ra_note, RA_NOTE, "not set yet");
	fs.hdr = calloc((size_t)m->nn * m->T, sizeof *fs.hdr);
	fs.bad = calloc(m->nn, sizeof *fs.bad);
	fs.rs = calloc(m->T, sizeof *fs.rs);
	if (!fs.hdr || !fs.bad || !fs.rs) {
		free(fs.hdr);
		free((void *)fs.bad);
		free(fs.rs);
		return tp_fail(e, TP_ENOMEM, "out of memory");
	}
	pthread_key_create(&scratch_key, scratch_free);

	int rc = -1, mounted = 0, pipefd[2] = {-1, -1};
	if (!o->foreground) {
		/* Fork before libfuse holds anything: the child mounts and serves; this process waits
		 * for its verdict (ready, or the reason it is not) and returns. */
		if (pipe(pipefd) < 0) {
			free(fs.hdr);
			free((void *)fs.bad);
			free(fs.rs);
			munmap(fs.ra_note, RA_NOTE);
			return tp_fail(e, TP_EIO, "pipe: %s", strerror(errno));
		}
		fflush(NULL);
		pid_t pid = fork();
		if (pid != 0) {
			close(pipefd[1]);
			free(fs.hdr);
			free((void *)fs.bad);
			free(fs.rs);
			if (pid < 0) {
				munmap(fs.ra_note, RA_NOTE);
				close(pipefd[0]);
				return tp_fail(e, TP_EIO, "fork: %s", strerror(errno));
			}
			*parent = 1;
			munmap(fs.ra_note, RA_NOTE);
			return wait_child(pipefd[0], pid, e);
		}
		close(pipefd[0]);
		pipefd[0] = -1;
		setsid();
		daemon_fd = pipefd[1];
	}

	char opts[4096];
	snprintf(opts, sizeof opts, "ro,fsname=tpfs,subtype=tpfs,default_permissions%s%s%s",
		 geteuid() == 0 ? ",allow_other" : "", o->fuse_opts ? "," : "", o->fuse_opts ? o->fuse_opts : "");
	char *argv[] = {"tpfs", "-o", opts, o->debug ? "-d" : NULL, NULL};
	struct fuse_args args = FUSE_ARGS_INIT(o->debug ? 4 : 3, argv);
	fs.se = fuse_session_new(&args, &ops, sizeof ops, &fs);
	if (!fs.se) {
		tp_fail(e, TP_EINVAL, "libfuse refused the mount options '%s'", opts);
		goto out;
	}
	if (fuse_session_mount(fs.se, o->mnt) != 0) {
		tp_fail(e, TP_EIO, "%s: mounting failed (see the message above; is /dev/fuse usable?)", o->mnt);
		goto out;
	}
	mounted = 1;
	if (fuse_set_signal_handlers(fs.se) != 0) {
		tp_fail(e, TP_EIO, "cannot install signal handlers");
		goto out;
	}
	tp_guard_install();

	fflush(NULL);
	pid_t helper = fork();
	if (helper == 0)
		ready_helper(&fs, daemon_fd);
	if (helper < 0) {
		tp_fail(e, TP_EIO, "fork: %s", strerror(errno));
		goto out;
	}
	if (daemon_fd >= 0) {
		/* the helper reports readiness to the parent; the daemon's output goes to the log */
		close(daemon_fd);
		daemon_fd = -1;
		detach_stdio(o->log_path);
	}
	if (!strcmp(o->gather, "cuda") || (!strcmp(o->gather, "auto") && o->cuda_min_runs && o->cuda_min_bytes)) {
		char why[256];
		if (tp_cuda_load(&fs.gpu, why, sizeof why) == 0) {
			fs.gpu_mode = !strcmp(o->gather, "cuda") ? 1 : 2;
			tp_fmt(fs.gather_note, sizeof fs.gather_note, "cuda on %s (%s)", why,
			       fs.gpu_mode == 1 ? "every strided gather" : "past --cuda-min-runs/--cuda-min-bytes");
		} else if (!strcmp(o->gather, "cuda")) {
			tp_fail(e, TP_EIO, "--gather cuda: %s", why);
			goto out;
		} else {
			tp_fmt(fs.gather_note, sizeof fs.gather_note, "cpu (auto: %s)", why);
		}
	}
	tp_log(1, "gather: %s", fs.gather_note);
	start_watching(&fs);
	struct fuse_loop_config *lc = fuse_loop_cfg_create();
	fuse_loop_cfg_set_max_threads(lc, o->threads ? o->threads : 16);
	fuse_loop_cfg_set_idle_threads(lc, o->threads ? o->threads : 16);
	int lr = fuse_session_loop_mt(fs.se, lc);
	fuse_loop_cfg_destroy(lc);
	stop_watching(&fs);
	if (waitpid(helper, NULL, WNOHANG) == 0) { /* still waiting for a mount that is going away */
		kill(helper, SIGKILL);
		waitpid(helper, NULL, 0);
	}
	fuse_remove_signal_handlers(fs.se);
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
out:
	if (rc < 0 && daemon_fd < 0 && !o->foreground)
		tp_log(2, "%s", e->msg); /* after readiness: only the log can tell */
	if (daemon_fd >= 0) {
		char msg[TP_ERR_MSG + 2];
		snprintf(msg, sizeof msg, "E%s", e->msg);
		if (write(daemon_fd, msg, strlen(msg)) < 0)
			tp_log(0, "could not report the failure to the parent");
		close(daemon_fd);
		daemon_fd = -1;
	}
	if (fs.se) {
		if (mounted)
			fuse_session_unmount(fs.se);
		fuse_session_destroy(fs.se);
	}
	fuse_opt_free_args(&args);
	for (size_t k = 0; k < (size_t)m->nn * m->T; k++)
		free(atomic_load(&fs.hdr[k]));
	free(fs.hdr);
	free((void *)fs.bad);
	free(fs.rs);
	if (log_file)
		fclose(log_file);
	log_file = NULL;
	munmap(fs.ra_note, RA_NOTE);
	if (fs.gpu.ops)
		fs.gpu.ops->destroy(fs.gpu.self);
	return rc;
}
