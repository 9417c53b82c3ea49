/* fs_names.c: the namespace of a mount: inodes, attributes, lookup, readdir, statfs, the
 * refusals of every writing call (EROFS), extended attributes, the stats file's text, which ranks
 * are served, each worker thread's reply buffer, and the namespace's operations (names_ops).
 *
 * Inodes are computed, never allocated: 1 is the top folder, 2 + r * nn + i is node i of the
 * model as rank r sees it (node 0 is the rank folder), 2 + T * nn is .tpfs-stats and the next one
 * MNT/config.json. Every inode lives as long as the mount, so lookup counts are not tracked.
 * Attributes and entries are cached for a long time: the files never change while mounted (a
 * source that does change makes its rank files fail with EIO). Owner, group and mode are the
 * source's.
 */
#include "fs_int.h"

/* ---- inodes and attributes ---- */

/* Is rank r served (--ranks)? */
int served(const tp_fs *fs, uint32_t r)
{
	return !fs->o->serve || fs->o->serve[r];
}

fuse_ino_t ino_of(const tp_fs *fs, uint32_t r, uint32_t i)
{
	return 2 + (fuse_ino_t)r * fs->nn + i;
}

int decode(const tp_fs *fs, fuse_ino_t ino, uint32_t *r, uint32_t *i)
{
	if (ino < 2 || ino >= fs->stats_ino)
		return -1;
	*r = (uint32_t)((ino - 2) / fs->nn);
	*i = (uint32_t)((ino - 2) % fs->nn);
	if (fs->m->view) { /* a view shows the source's other files once, as rank 0's (config.json: cfg_ino) */
		tp_node_kind k = fs->m->tree.n[*i].kind;
		return *r == 0 && k != TN_TENSORS && k != TN_INDEX && k != TN_CONFIG ? 0 : -1;
	}
	return served(fs, *r) ? 0 : -1;
}

int vdecode(const tp_fs *fs, fuse_ino_t ino, uint32_t *r, size_t *p)
{
	if (!fs->vnp || ino < fs->vpart_ino || ino - fs->vpart_ino >= (fuse_ino_t)fs->T * fs->vnp)
		return -1;
	*r = (uint32_t)((ino - fs->vpart_ino) / fs->vnp);
	*p = (size_t)((ino - fs->vpart_ino) % fs->vnp);
	return served(fs, *r) && tp_model_view_slot(fs->m, *r, *p) ? 0 : -1;
}

/* The view's part file called name ("model-rank-R-part-K.safetensors", or with stages
 * "model-pp-S-tp-R-part-K.safetensors", or with data-parallel ranks
 * "model-dp-S-rank-R-part-K.safetensors"), or 0. */
static fuse_ino_t vlookup(const tp_fs *fs, const char *name)
{
	unsigned r, s = 0;
	size_t p;
	int len = 0;
	const tp_model *m = fs->m;
	if (m->P > 1 ? sscanf(name, "model-pp-%u-tp-%u-part-%zu.safetensors%n", &s, &r, &p, &len) != 3
	    : m->D > 1 ? sscanf(name, "model-dp-%u-rank-%u-part-%zu.safetensors%n", &s, &r, &p, &len) != 3
		     : sscanf(name, "model-rank-%u-part-%zu.safetensors%n", &r, &p, &len) != 2)
		return 0;
	if (name[len] || r >= m->T || (uint64_t)s * m->T >= tp_model_ranks(m))
		return 0;
	uint32_t g = s * m->T + r;
	if (!tp_model_view_slot(m, g, p) || !served(fs, g))
		return 0;
	char canon[96];
	tp_model_view_name(m, g, p, canon, sizeof canon);
	return strcmp(canon, name) ? 0 : fs->vpart_ino + (fuse_ino_t)g * fs->vnp + p;
}

static size_t stats_size(const tp_fs *fs);
static int64_t storage_read(void);

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
		st->st_nlink = 2 + (fs->vnp ? 0 : fs->o->serve ? fs->o->nserve : fs->T);
		st->st_size = 4096;
		st->st_mtim = fs->m->tree.n[0].mtime;
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
		st->st_mtim = fs->m->tree.n[fs->m->config_node].mtime;
	} else if (fs->vnp && ino >= fs->vpart_ino) {
		size_t p;
		tp_view_file vf;
		if (vdecode(fs, ino, &r, &p) == 0 && tp_model_view_file(fs->m, r, p, &vf)) {
			/* a part file: its own source file's owner and mode */
			uint32_t own = vf.own;
			st->st_mode = S_IFREG | (atomic_load(&fs->ns[own].mode) & 0555);
			st->st_uid = atomic_load(&fs->ns[own].uid);
			st->st_gid = atomic_load(&fs->ns[own].gid);
			st->st_nlink = 1;
			st->st_size = (off_t)vf.layout->size;
			st->st_mtim = fs->m->tree.n[own].mtime;
		}
	} else if (decode(fs, ino, &r, &i) == 0) {
		const tp_node *n = &fs->m->tree.n[i];
		uint32_t mode = atomic_load(&fs->ns[i].mode);
		st->st_mtim = n->mtime;
		st->st_uid = atomic_load(&fs->ns[i].uid);
		st->st_gid = atomic_load(&fs->ns[i].gid);
		if (n->kind == TN_DIR) {
			st->st_mode = S_IFDIR | (mode & 0555);
			st->st_nlink = 2;
			for (uint32_t k = 0; k < n->nchild; k++)
				st->st_nlink += fs->m->tree.n[n->child[k]].kind == TN_DIR;
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
	if (fuse_reply_entry(req, &e) == 0 && fs->looked && ino < fs->nlooked) /* the push may store into it (fs_push.c) */
		atomic_fetch_add_explicit(&fs->looked[ino], 1, memory_order_relaxed);
}

/* ---- operations ---- */

static void op_init(void *data, struct fuse_conn_info *conn)
{
	tp_fs *fs = data;
	atomic_store(&fs->io_base, storage_read()); /* before any read: the stats count from here */
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
		if (fs->m->view) { /* the source's other files, then the part files */
			uint32_t c = tp_node_child(&fs->m->tree, 0, name);
			fuse_ino_t v = vlookup(fs, name);
			if (v)
				reply_entry(req, fs, v);
			else if (c != UINT32_MAX && decode(fs, ino_of(fs, 0, c), &r, &i) == 0)
				reply_entry(req, fs, ino_of(fs, 0, c));
			else
				fuse_reply_err(req, ENOENT);
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
	if (decode(fs, parent, &r, &i) < 0 || fs->m->tree.n[i].kind != TN_DIR) {
		fuse_reply_err(req, ENOTDIR);
		return;
	}
	uint32_t c = tp_node_child(&fs->m->tree, i, name), cr, ci;
	if (c == UINT32_MAX || decode(fs, ino_of(fs, r, c), &cr, &ci) < 0)
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
	size_t p;
	if (ino != FUSE_ROOT_ID && ino != fs->stats_ino && ino != fs->cfg_ino && decode(fs, ino, &r, &i) < 0 &&
	    vdecode(fs, ino, &r, &p) < 0) {
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
	if (!top && (decode(fs, ino, &r, &i) < 0 || fs->m->tree.n[i].kind != TN_DIR)) {
		fuse_reply_err(req, ENOTDIR);
		return;
	}
	uint32_t nranks = fs->o->serve ? fs->o->nserve : fs->T, rk = 0;
	count = 2 + (top ? nranks + 1 + (fs->cfg_ino != 0) : fs->m->tree.n[i].nchild);
	if (top && fs->m->view) /* the source's top files, every served rank's parts, stats, config.json */
		count = 2 + fs->m->tree.n[0].nchild + nranks * (uint32_t)fs->vnp + 1 + (fs->cfg_ino != 0);
	size_t used = 0;
	for (off_t k = off; k < (off_t)count; k++) {
		char name[96];
		const char *nm;
		struct stat st;
		memset(&st, 0, sizeof st);
		fuse_ino_t child;
		if (k < 2) {
			nm = k ? ".." : ".";
			child = ino;
		} else if (top && fs->m->view) {
			off_t q = k - 2, nc = fs->m->tree.n[0].nchild, np = (off_t)nranks * (off_t)fs->vnp;
			uint32_t cr, ci;
			if (q < nc) {
				uint32_t c = fs->m->tree.n[0].child[q];
				if (decode(fs, ino_of(fs, 0, c), &cr, &ci) < 0)
					continue; /* a tensor or index file, or config.json (listed below) */
				nm = fs->m->tree.n[c].name;
				child = ino_of(fs, 0, c);
			} else if (q < nc + np) {
				uint32_t want = (uint32_t)((q - nc) / (off_t)fs->vnp);
				size_t p = (size_t)((q - nc) % (off_t)fs->vnp);
				for (uint32_t seen = 0; rk < fs->T; rk++)
					if (served(fs, rk) && seen++ == want)
						break;
				uint32_t g = rk;
				rk = 0;
				if (!tp_model_view_slot(fs->m, g, p))
					continue; /* a stage with fewer parts */
				tp_model_view_name(fs->m, g, p, name, sizeof name);
				nm = name;
				child = fs->vpart_ino + (fuse_ino_t)g * fs->vnp + p;
			} else {
				nm = q == nc + np ? STATS_NAME : "config.json";
				child = q == nc + np ? fs->stats_ino : fs->cfg_ino;
			}
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
			uint32_t c = fs->m->tree.n[i].child[k - 2], cr, ci;
			if (decode(fs, ino_of(fs, r, c), &cr, &ci) < 0)
				continue; /* under a view: a tensor or index file */
			nm = fs->m->tree.n[c].name;
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

static void op_statfs(fuse_req_t req, fuse_ino_t ino)
{
	(void)ino;
	tp_fs *fs = fuse_req_userdata(req);
	struct statvfs sv;
	memset(&sv, 0, sizeof sv);
	sv.f_bsize = sv.f_frsize = 4096;
	uint64_t total = 0, files = 2;
	uint32_t r, i;
	for (i = 0; i < fs->nn; i++) /* what readdir shows: each file as decode lets it be seen */
		for (r = 0; r < fs->T && fs->m->tree.n[i].kind != TN_DIR; r++) {
			uint32_t rr, ii;
			if (decode(fs, ino_of(fs, r, i), &rr, &ii) == 0) {
				total += tp_node_size(fs->m, i, r);
				files++;
			}
		}
	for (r = 0; r < fs->T && fs->vnp; r++) /* a view's part files, for the ranks served */
		for (size_t p = 0; p < fs->vnp && served(fs, r); p++) {
			tp_view_file vf;
			if (!tp_model_view_file(fs->m, r, p, &vf))
				continue;
			total += vf.layout->size;
			files++;
		}
	if (fs->cfg_ino) { /* MNT/config.json, the source's */
		total += fs->m->config_len;
		files++;
	}
	sv.f_blocks = total / 4096 + 1;
	sv.f_files = (fsfilcnt_t)files;
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

/* The namespace side of the operations table (fs_session.c assembles it): every operation but
 * open, read and release (fs_read.c's). */
void names_ops(struct fuse_lowlevel_ops *o)
{
	o->init = op_init;
	o->lookup = op_lookup;
	o->getattr = op_getattr;
	o->readdir = op_readdir;
	o->statfs = op_statfs;
	o->setattr = op_setattr;
	o->mknod = op_mknod;
	o->mkdir = op_mkdir;
	o->unlink = op_unlink;
	o->rmdir = op_unlink;
	o->symlink = op_symlink;
	o->rename = op_rename;
	o->link = op_link;
	o->write = op_write;
	o->create = op_create;
	o->setxattr = op_setxattr;
	o->removexattr = op_removexattr;
	o->getxattr = op_getxattr;
	o->listxattr = op_listxattr;
}

/* ---- counters ---- */

/* Bytes storage delivered for this process's reads so far: read_bytes of /proc/self/io (the
 * reads its threads submitted to a block device, readahead they caused included, summed over
 * threads), or -1 where the kernel does not say. */
static int64_t storage_read(void)
{
	char buf[1024];
	int fd = open("/proc/self/io", O_RDONLY | O_CLOEXEC);
	ssize_t got = fd < 0 ? -1 : read(fd, buf, sizeof buf - 1);
	if (fd >= 0)
		close(fd);
	if (got <= 0)
		return -1;
	buf[got] = 0;
	const char *p = strstr(buf, "\nread_bytes: ");
	unsigned long long v;
	return p && sscanf(p, "\nread_bytes: %llu", &v) == 1 ? (int64_t)v : -1;
}

/* The stats file's push line into b (at most cap bytes, NUL included): "push: off", or the bytes
 * pushed, the budget, the state (running, done, stopped at the budget, stopped), the source bytes it
 * read with O_DIRECT (--push-io direct), the bytes of the files to push and those it skipped (reads
 * had replied them). Returns what snprintf returns. */
static size_t push_text(const tp_fs *fs, char *b, size_t cap)
{
	if (!fs->push_budget)
		return (size_t)snprintf(b, cap, "push: off\n");
	const uint64_t pushed = atomic_load(&fs->pushed), total = atomic_load(&fs->push_total);
	const uint64_t skipped = atomic_load(&fs->push_skipped);
	const uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
	const char *state = !atomic_load(&fs->push_done) ? "running"
			    : pushed + skipped >= total       ? "done"
			    : pushed + page > fs->push_budget ? "stopped at the budget"
							      : "stopped (the log says why)";
	return (size_t)snprintf(b, cap, "push: pushed %llu of %llu bytes, %s; source bytes read with O_DIRECT %llu; "
				"the served files hold %llu; skipped %llu (read before the push came to them)\n",
				(unsigned long long)pushed, (unsigned long long)fs->push_budget, state,
				(unsigned long long)atomic_load(&fs->push_direct), (unsigned long long)total,
				(unsigned long long)skipped);
}

/* The stats file's size: its text is padded to it, so that stat tells exactly what a read gives
 * (tar, du and cp see the whole file) however the counters grow: a bound on the header lines
 * (the source path, the plan's origin, the readahead and gather notes, the log's place, the
 * source byte counts), 128 bytes a rank, and the failed files' lines. */
static size_t stats_size(const tp_fs *fs)
{
	return 1024 + 220 /* the push line */ + 400 /* the passthrough line */ + 32 + sizeof fs->oom_note /* the oom_score_adj line */ + 16 + sizeof fs->nice_note + strlen(fs->m->src) + strlen(fs->m->plan_origin) + RA_NOTE + sizeof fs->gather_note + PATH_MAX +
	       (size_t)(fs->o->serve ? fs->o->nserve : fs->T) * 128 + failures_text_max();
}

char *stats_text(tp_fs *fs, size_t *len)
{
	size_t cap = stats_size(fs);
	char *b = malloc(cap);
	if (!b)
		return NULL;
	char pp[80] = ""; /* with stages or DP ranks: how the rank numbers below are made */
	if (fs->m->P > 1)
		snprintf(pp, sizeof pp, "pp: %u (rank = stage x tp + TP rank)\n", fs->m->P);
	else if (fs->m->D > 1)
		snprintf(pp, sizeof pp, "dp: %u (rank = DP rank x tp + TP rank: the EP rank)\n", fs->m->D);
	/* what tpfs used of the source, and what storage delivered (issue 52) */
	uint64_t used = 0;
	for (uint32_t r = 0; r < fs->T; r++)
		used += atomic_load(&fs->rs[r].touched);
	int64_t base = atomic_load(&fs->io_base), now = base < 0 ? -1 : storage_read();
	char fetched[64] = "unknown (the kernel does not say: no /proc/self/io)";
	if (now >= 0)
		snprintf(fetched, sizeof fetched, "%lld", (long long)(now > base ? now - base : 0));
	size_t w = (size_t)snprintf(b, cap,
				    "tpfs %s\nsource: %s\ntp: %u\n%splan: %s\nreadahead: %s\ngather: %s\nlog: %.*s\n"
				    "source_used: %llu (bytes of the source copied into replies and pushed pages: source_bytes below, summed)\n"
				    "source_fetched: %s (bytes storage delivered for the daemon's reads since it began serving, the "
				    "kernel's readahead included: read_bytes of its /proc/self/io, which counts block I/O: a lower bound, "
				    "often 0, on network and FUSE file systems)\n"
				    "%-6s %16s %16s %10s %10s %10s\n",
				    TPFS_VERSION, fs->m->src, fs->m->T, pp, fs->m->plan_origin, fs->ra_note, fs->gather_note,
				    PATH_MAX, log_where(), (unsigned long long)used, fetched, "rank", "bytes_served",
				    "source_bytes", "reads", "copied", "gpu");
	for (uint32_t r = 0; r < fs->T && w < cap; r++)
		if (served(fs, r))
			w += (size_t)snprintf(b + w, cap - w, "%-6u %16llu %16llu %10llu %10llu %10llu\n", r,
				      (unsigned long long)atomic_load(&fs->rs[r].served),
				      (unsigned long long)atomic_load(&fs->rs[r].touched),
				      (unsigned long long)atomic_load(&fs->rs[r].reads),
				      (unsigned long long)atomic_load(&fs->rs[r].copied),
				      (unsigned long long)atomic_load(&fs->rs[r].gpu));
	if (w < cap) /* push-ahead (fs_push.c) */
		w += push_text(fs, b + w, cap - w);
	if (w < cap) /* copies served by passthrough (fs_pass.c) */
		w += pass_text(fs, b + w, cap - w);
	if (w < cap) /* what the kernel's OOM killer sees of the daemon (fs_session.c) */
		w += (size_t)snprintf(b + w, cap - w, "oom_score_adj: %s\n", fs->oom_note[0] ? fs->oom_note : "not set yet");
	if (w < cap) /* the request threads' priority (fs_session.c) */
		w += (size_t)snprintf(b + w, cap - w, "nice: %s\n", fs->nice_note[0] ? fs->nice_note : "not set yet");
	if (w < cap)
		w += failures_text(b + w, cap - w);
	if (w > cap - 1)
		w = cap - 1;
	memset(b + w, ' ', cap - 1 - w); /* padded with spaces to the size stat gives */
	b[cap - 1] = '\n';
	*len = cap;
	return b;
}
