/* fs_watch.c: changed sources: the identity checks every read makes, the change mark, the
 * invalidation thread and the watcher thread.
 *
 * Every source file is watched itself (inotify on its inode: a write through a hard link
 * elsewhere is seen) and through its folders (renames, removals); a change marks the node for
 * good and queues the invalidation of its rank files' cached pages, which a separate thread sends
 * to the kernel: no request handler ever waits on the kernel (an invalidation waits for pages a
 * READ in flight holds). A source that cannot be looked at for a passing reason (out of
 * descriptors or memory) is not a change: that request alone fails.
 */
#include "fs_int.h"

/* ---- changed sources ---- */

/* The identity of a source as planned is (size, mtime, device, inode), plus its ctime, which
 * also moves on an attribute change (chmod, chown): a ctime that moved while size and mtime did
 * not is accepted as an attribute change by the watcher (which has seen no write), and until it
 * has looked, reads of that file fail with EIO without failing the file. */

uint64_t ts_ns(struct timespec t)
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
void mark_bad(tp_fs *fs, uint32_t i, const char *why)
{
	if (atomic_exchange(&fs->ns[i].bad, 1))
		return;
	tp_log(2, "%s: the source changed since it was mounted (%s); its rank files now fail with EIO "
		  "(remount to serve the new version)", fs->m->tree.n[i].path, why);
	note_failure(fs->m->tree.n[i].path, "the source changed since it was mounted (%s): every file served from it "
		     "fails with EIO until a remount", why);
	queue_inval(fs, i, 0);
}

/* Opens a source's resolved path (which holds no link) without following any link on the way:
 * a link met means a folder on the path was replaced since mounting, perhaps by a link into the
 * mount itself, where this thread would wait on its own mount (with every worker waiting, even
 * SIGTERM cannot end the daemon). Fails with ELOOP then. */
int open_real(const char *real, int flags)
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
int transient(int err)
{
	return err == EMFILE || err == ENFILE || err == ENOMEM || err == EINTR || err == EAGAIN || err == ENOBUFS;
}

/* Compares the file behind fd (or, with fd < 0, node i's resolved path) with what was planned.
 * Returns 0 (the same), 1 (changed: why says how), 2 (only the ctime moved: an attribute
 * change the watcher has not accepted yet; with accept, it is accepted now) or 3 (it could not
 * be looked at for a transient reason, transient(errno): why says which; nothing is known). */
static int differs(tp_fs *fs, uint32_t i, int fd, int accept, char *why, size_t len)
{
	const tp_node *n = &fs->m->tree.n[i];
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
void log_unchecked(const tp_fs *fs, uint32_t i, const char *why, const char *what)
{
	char msg[TP_ERR_MSG];
	tp_fmt(msg, sizeof msg, "%s: the source could not be checked (%s): %s; the file stays served",
	       fs->m->tree.n[i].path, why, what);
	note_failure(fs->m->tree.n[i].path, "the source could not be checked (%s): %s; the file stays served", why, what);
	if (tp_log_shown(msg))
		tp_log(0, "%s", msg);
}

/* May node i be served? One fstat of the open source (or a stat of its resolved path). Returns
 * 0, or the errno the request must fail with: EIO when the source changed (the file is marked
 * changed then, for good) or only its ctime moved; the transient errno (EMFILE, ENOMEM, ...) when
 * it could not be looked at, which fails this request alone. */
int source_check(tp_fs *fs, uint32_t i, int fd)
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
	else if (d == 2)
		note_failure(fs->m->tree.n[i].path, "a read met an attribute change (chmod, chown) the watcher had not seen "
			     "yet: that read failed with EIO; the file stays served");
	return d ? EIO : 0;
}

/* After a successful reply: a change noticed while the reply was under way may have been
 * followed by its invalidation before the kernel cached this reply's pages; drop them again. */
void after_reply(tp_fs *fs, uint32_t i)
{
	if (atomic_load(&fs->ns[i].bad))
		queue_inval(fs, i, 0);
}

/* The pages of served file ino from offset off (or with off -1 its attributes); with pages, its
 * copy for passthrough goes first (fs_pass.c), whether or not the mount answers yet. */
static void inval_file(tp_fs *fs, fuse_ino_t ino, off_t off)
{
	if (off >= 0 && fs->pass)
		pass_revoke(fs, ino);
	if (atomic_load(&fs->ready))
		fuse_lowlevel_notify_inval_inode(fs->se, ino, off, 0);
}

/* --view: the part files of every rank that read node i (pages, or with off -1 attributes). */
static void inval_parts(tp_fs *fs, uint32_t i, off_t off)
{
	for (uint32_t r = 0; r < fs->T && (atomic_load(&fs->ready) || fs->pass); r++)
		for (size_t p = 0; p < fs->vnp; p++) {
			tp_view_file vf;
			if (!tp_model_view_file(fs->m, r, p, &vf))
				break;
			int reads = 0;
			for (uint32_t k = 0; k < vf.nsrc && !reads; k++)
				reads = vf.nodes[k] == i;
			if (reads)
				inval_file(fs, fs->vpart_ino + (fuse_ino_t)r * fs->vnp + p, off);
		}
}

/* Every file served from node i: its rank copies, the view's part files that read it, and
 * MNT/config.json where i is the source's config.json (pages from offset off, or with off -1
 * attributes only). The top folder and the stats file take SRC's attributes too. */
static void inval_node(tp_fs *fs, uint32_t i, off_t off)
{
	for (uint32_t r = 0; r < fs->T && (atomic_load(&fs->ready) || fs->pass); r++)
		inval_file(fs, ino_of(fs, r, i), off);
	inval_parts(fs, i, off);
	if (fs->cfg_ino && i == fs->m->config_node && atomic_load(&fs->ready))
		fuse_lowlevel_notify_inval_inode(fs->se, fs->cfg_ino, off, 0);
	if (i == 0 && atomic_load(&fs->ready)) {
		fuse_lowlevel_notify_inval_inode(fs->se, FUSE_ROOT_ID, -1, 0);
		fuse_lowlevel_notify_inval_inode(fs->se, fs->stats_ino, -1, 0);
	}
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
			inval_node(fs, i, v[k] & INVAL_ATTR ? -1 : 0);
		}
		if (atomic_exchange(&fs->inval_lost, 0))
			for (uint32_t i = 0; i < fs->nn; i++)
				inval_node(fs, i, atomic_load(&fs->ns[i].bad) ? 0 : -1);
	}
	return NULL;
}

/* Starts a thread of our own with every signal blocked (as libfuse starts its workers): SIGTERM
 * and SIGINT must reach the thread that waits for the FUSE loop to end, not one that would take
 * the signal and go back to waiting while the loop never learns of it. */
int start_thread(pthread_t *t, void *(*fn)(void *), void *arg)
{
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &old);
	int rc = pthread_create(t, NULL, fn, arg);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	return rc;
}

int start_inval(tp_fs *fs)
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
void stop_inval(tp_fs *fs)
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
		if (d == 1 && fs->m->tree.n[i].kind != TN_DIR)
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
	const tp_node *n = &fs->m->tree.n[i];
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

void start_watching(tp_fs *fs)
{
	fs->ifd = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
	if (fs->ifd < 0 || pipe(fs->stop) < 0) {
		tp_log(0, "cannot watch the sources (%s): changes are noticed by size and mtime checks only", strerror(errno));
		return;
	}
	size_t cap = 0, failed = 0;
	int err = 0;
	for (uint32_t i = 0; i < fs->nn; i++) {
		const tp_node *n = &fs->m->tree.n[i];
		int rc = add_watch(fs, n->real, "", i, &cap);
		if (i && rc == 0) /* the name under its folder as given: that folder resolved is the parent's */
			rc = add_watch(fs, fs->m->tree.n[n->parent].real, n->name, i, &cap);
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

void stop_watching(tp_fs *fs)
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
