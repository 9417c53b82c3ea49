/* srctree.c: walking SRC into the source tree's nodes (see srctree.h): folders in name order,
 * symbolic links resolved before any mount exists (a link into the mount point refused), link
 * loops, dangling links and special files skipped with a warning, paths past PATH_MAX left out by
 * name, the named limits (files, entries per folder, depth) enforced; and finding nodes by name
 * and by relative path. */
#include "srctree.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int ends_with(const char *s, const char *suf)
{
	size_t a = strlen(s), b = strlen(suf);
	return a >= b && strcmp(s + a - b, suf) == 0;
}

static char *join(const char *a, const char *b)
{
	size_t la = strlen(a), lb = strlen(b);
	char *s = malloc(la + lb + 2);
	if (!s)
		return NULL;
	memcpy(s, a, la);
	size_t k = la;
	if (la && lb)
		s[k++] = '/';
	memcpy(s + k, b, lb + 1);
	return s;
}

/* One walk: the tree it fills and what it was told. */
typedef struct walk {
	tp_srctree *t;
	const char *src; /* SRC as given, for messages */
	const char *mnt; /* the mount point, or NULL */
	tp_log_fn log;
	void *log_ctx;
} walk;

#define walk_log(w, ...) tp_logf((w)->log, (w)->log_ctx, 0, __VA_ARGS__)

/* Adds node (rel, abs, kind, st) under parent, resolving its links, its number in *out. Returns
 * 0, or -1 with e set (the node limit, a link into the mount point, out of memory). */
static int add_node(walk *w, uint32_t parent, const char *rel, const char *abs, tp_node_kind kind,
		    const struct stat *st, uint32_t *out, tp_err *e)
{
	tp_srctree *t = w->t;
	if (t->nn >= TP_MAX_NODES)
		return tp_fail(e, TP_ELIMIT, "%s: more than %d files and folders, the tpfs limit", w->src, TP_MAX_NODES);
	if (t->nn == t->cap) {
		uint32_t cap = t->cap ? t->cap * 2 : 64;
		tp_node *n = realloc(t->n, cap * sizeof *n);
		if (!n)
			return tp_fail(e, TP_ENOMEM, "out of memory");
		t->n = n;
		t->cap = cap;
	}
	tp_node *n = &t->n[t->nn];
	memset(n, 0, sizeof *n);
	n->path = strdup(rel);
	n->abspath = strdup(abs);
	/* Links are resolved now, before the mount exists: the filesystem stats and opens the
	 * resolved path, so no request handler ever resolves a link (which could lead into the
	 * mount and wait on it). A link into the mount point is refused for the same reason. */
	n->real = realpath(abs, NULL);
	if (!n->real && errno != ENOMEM)
		n->real = strdup(abs);
	if (!n->path || !n->abspath || !n->real) {
		free(n->path);
		free(n->abspath);
		free(n->real);
		return tp_fail(e, TP_ENOMEM, "out of memory");
	}
	const char *mnt = w->mnt;
	size_t ml = mnt ? strlen(mnt) : 0;
	if (mnt && ml && !strncmp(n->real, mnt, ml) && (n->real[ml] == '/' || n->real[ml] == 0 || ml == 1)) {
		tp_fail(e, TP_EINVAL, "%s: leads into the mount point %s (as %s): the mount would read itself; "
			"remove the link or mount elsewhere", rel[0] ? rel : abs, mnt, n->real);
		free(n->path);
		free(n->abspath);
		free(n->real);
		return -1;
	}
	const char *slash = strrchr(n->path, '/');
	n->name = slash ? slash + 1 : n->path;
	n->parent = parent;
	n->kind = kind;
	n->fd = -1;
	n->mtime = st->st_mtim;
	n->src_size = (uint64_t)st->st_size;
	n->dev = st->st_dev;
	n->ino = st->st_ino;
	n->mode = st->st_mode;
	n->uid = st->st_uid;
	n->gid = st->st_gid;
	n->ctime = st->st_ctim;
	*out = t->nn++;
	return 0;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Adds the entries of folder node dir (depth: its nesting) and recurses. Returns 0, or -1 with e
 * set (a named limit, an unreadable folder, out of memory). */
static int walk_dir(walk *w, uint32_t dir, int depth, tp_err *e)
{
	tp_srctree *t = w->t;
	if (depth > TP_MAX_DEPTH)
		return tp_fail(e, TP_ELIMIT, "%s: folders nested deeper than %d, the tpfs limit", t->n[dir].path,
			       TP_MAX_DEPTH);
	char *abs = strdup(t->n[dir].abspath), *rel = strdup(t->n[dir].path);
	DIR *d = abs ? opendir(abs) : NULL;
	if (!d) {
		int err = errno;
		free(abs);
		free(rel);
		return tp_fail(e, TP_EIO, "%s: cannot read folder: %s", t->n[dir].path[0] ? t->n[dir].path : w->src,
			       strerror(err));
	}
	char **names = NULL;
	size_t nnames = 0, cap = 0;
	struct dirent *de;
	int rc = 0;
	while ((de = readdir(d))) {
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		if (nnames == TP_MAX_DIR_ENTRIES) {
			rc = tp_fail(e, TP_ELIMIT, "%s: more than %d entries in one folder, the tpfs limit",
				     rel[0] ? rel : w->src, TP_MAX_DIR_ENTRIES);
			break;
		}
		if (nnames == cap) {
			cap = cap ? cap * 2 : 32;
			char **nn = realloc(names, cap * sizeof *nn);
			if (!nn) {
				rc = tp_fail(e, TP_ENOMEM, "out of memory");
				break;
			}
			names = nn;
		}
		names[nnames] = strdup(de->d_name);
		if (!names[nnames]) {
			rc = tp_fail(e, TP_ENOMEM, "out of memory");
			break;
		}
		nnames++;
	}
	closedir(d);
	if (rc == 0)
		qsort(names, nnames, sizeof *names, cmp_str);
	uint32_t *kids = calloc(nnames ? nnames : 1, sizeof *kids);
	uint32_t nk = 0;
	if (!kids && rc == 0)
		rc = tp_fail(e, TP_ENOMEM, "out of memory");
	for (size_t i = 0; i < nnames && rc == 0; i++) {
		char *cabs = join(abs, names[i]), *crel = join(rel, names[i]);
		struct stat st;
		if (!cabs || !crel) {
			rc = tp_fail(e, TP_ENOMEM, "out of memory");
		} else if (strlen(cabs) >= PATH_MAX) {
			/* sources are opened by path when read: one this long cannot be (ENAMETOOLONG) */
			char shown[256];
			size_t l = strlen(crel);
			tp_fmt(shown, sizeof shown, "%.120s...%s", crel, crel + (l > 100 ? l - 100 : 0));
			walk_log(w, "%s: left out of every rank, with everything under it: its source path is %zu "
				     "bytes, longer than the %d-byte path limit (PATH_MAX) of the system calls tpfs reads "
				     "sources with", l > 220 ? shown : crel, strlen(cabs), PATH_MAX);
		} else if (stat(cabs, &st) < 0) {
			walk_log(w, "%s: skipped: %s", crel,
			      errno == ELOOP ? "symbolic link loop" : errno == ENOENT ? "dangling symbolic link" : strerror(errno));
		} else if (S_ISDIR(st.st_mode)) {
			int loop = 0;
			for (uint32_t a = dir;; a = t->n[a].parent) {
				if (t->n[a].dev == st.st_dev && t->n[a].ino == st.st_ino)
					loop = 1;
				if (a == 0)
					break;
			}
			uint32_t id;
			if (loop)
				walk_log(w, "%s: skipped: symbolic link loop (it leads back to a folder above it)", crel);
			else if ((rc = add_node(w, dir, crel, cabs, TN_DIR, &st, &id, e)) == 0)
				kids[nk++] = id;
		} else if (S_ISREG(st.st_mode)) {
			tp_node_kind k = ends_with(names[i], ".safetensors") ? TN_TENSORS
					 : ends_with(names[i], ".safetensors.index.json") ? TN_INDEX : TN_PLAIN;
			uint32_t id;
			if ((rc = add_node(w, dir, crel, cabs, k, &st, &id, e)) == 0)
				kids[nk++] = id;
		} else {
			walk_log(w, "%s: skipped: not a regular file or folder", crel);
		}
		free(cabs);
		free(crel);
	}
	for (size_t i = 0; i < nnames; i++)
		free(names[i]);
	free(names);
	free(abs);
	free(rel);
	if (rc < 0) {
		free(kids);
		return rc;
	}
	t->n[dir].child = kids;
	t->n[dir].nchild = nk;
	for (uint32_t i = 0; i < nk && rc == 0; i++)
		if (t->n[kids[i]].kind == TN_DIR)
			rc = walk_dir(w, kids[i], depth + 1, e);
	return rc;
}

uint32_t tp_node_child(const tp_srctree *t, uint32_t dir, const char *name)
{
	const tp_node *d = &t->n[dir];
	size_t lo = 0, hi = d->nchild;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		int c = strcmp(name, t->n[d->child[mid]].name);
		if (c == 0)
			return d->child[mid];
		if (c < 0)
			hi = mid;
		else
			lo = mid + 1;
	}
	return UINT32_MAX;
}

/* Resolves a relative file path (as an index's weight_map gives it) from folder dir. */
static uint32_t resolve_rel(const tp_srctree *t, uint32_t dir, const char *rel)
{
	char part[4096];
	uint32_t cur = dir;
	while (*rel) {
		const char *slash = strchr(rel, '/');
		size_t l = slash ? (size_t)(slash - rel) : strlen(rel);
		if (l >= sizeof part)
			return UINT32_MAX;
		memcpy(part, rel, l);
		part[l] = 0;
		if (strcmp(part, ".") != 0 && l) {
			if (t->n[cur].kind != TN_DIR)
				return UINT32_MAX;
			cur = strcmp(part, "..") == 0 ? t->n[cur].parent : tp_node_child(t, cur, part);
			if (cur == UINT32_MAX)
				return UINT32_MAX;
		}
		rel += l + (slash ? 1 : 0);
	}
	return cur;
}

uint32_t tp_node_resolve(const tp_srctree *t, uint32_t dir, const char *rel)
{
	return resolve_rel(t, dir, rel);
}


int tp_srctree_open(tp_srctree *t, const char *src, const char *mnt, tp_log_fn log, void *log_ctx, tp_err *e)
{
	memset(t, 0, sizeof *t);
	walk w = {t, src, mnt, log, log_ctx};
	struct stat st;
	if (stat(src, &st) < 0)
		return tp_fail(e, TP_EINVAL, "%s: %s", src, strerror(errno));
	if (!S_ISDIR(st.st_mode))
		return tp_fail(e, TP_EINVAL, "%s: not a folder (give the folder that holds config.json and the .safetensors "
			       "files)", src);
	uint32_t root;
	if (add_node(&w, 0, "", src, TN_DIR, &st, &root, e) < 0)
		return -1;
	return walk_dir(&w, 0, 0, e);
}

void tp_srctree_free(tp_srctree *t)
{
	for (uint32_t i = 0; i < t->nn; i++) {
		tp_node *n = &t->n[i];
		free(n->child);
		free(n->path);
		free(n->abspath);
		free(n->real);
	}
	free(t->n);
	memset(t, 0, sizeof *t);
}
