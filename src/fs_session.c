/* fs_session.c: a mount's life: tp_fs_main and what it needs once (the background fork and
 * its report to the waiting parent, the FUSE session and mount, the readahead window, the ready
 * helper, the daemon's OOM score, the gather backend, the threads of fs_watch.c and fs_push.c).
 *
 * tp_fs_main acquires in order (the note page, per-node state, the background fork, the FUSE
 * session, signal handlers, the mount, the invalidation thread, the ready helper, the gather
 * backend, the watcher, the push thread) and releases in reverse, one label per resource.
 */
#include "fs_int.h"
#include <sys/resource.h>

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

/* --push: the kernel stores pages only into inodes it has looked up (fs_push.c); in the ready
 * helper, once the mount answers, a stat of every served tensor or part file looks it up, so the
 * push can start before a loader opens anything. A file that cannot be looked up is pushed when a
 * loader looks it up itself. */
static void look_up_served(const tp_fs *fs)
{
	char path[PATH_MAX + 128];
	struct stat st;
	const tp_model *m = fs->m;
	for (uint32_t r = 0; r < fs->T; r++) {
		if (!served(fs, r))
			continue;
		for (size_t p = 0; p < fs->vnp; p++) {
			if (!tp_model_view_slot(m, r, p))
				continue;
			char nm[96];
			tp_model_view_name(m, r, p, nm, sizeof nm);
			if (snprintf(path, sizeof path, "%s/%s", fs->o->mnt, nm) < (int)sizeof path)
				stat(path, &st);
		}
		for (uint32_t i = 0; !fs->vnp && i < fs->nn; i++)
			if (m->tree.n[i].kind == TN_TENSORS &&
			    snprintf(path, sizeof path, "%s/rank%u/%s", fs->o->mnt, r, m->tree.n[i].path) < (int)sizeof path)
				stat(path, &st);
	}
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
	if (msg[0] == 'O' && fs->push_budget)
		look_up_served(fs);
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

/* The kernel's OOM killer, under a memory limit (issue 50): when the anonymous memory of a cgroup (a
 * container holding an engine and this daemon) passes its limit, the kernel kills the process of the
 * cgroup with the highest score: its resident and swapped pages, plus oom_score_adj thousandths of the
 * memory the cgroup (or machine) allows. The daemon's death fails every reader of the mount at once
 * (ENOTCONN, a bus error in an mmap loader) and frees little: its own memory is bounded (the plan,
 * fixed at mount; per worker thread a scratch buffer of about 1 MiB and libfuse's receive buffer),
 * and what it caches is clean page cache the kernel reclaims without killing anyone. So it lowers its
 * score to OOM_ADJ, -999: never chosen while another process of the cgroup holds more than a
 * thousandth of the limit, yet still killable when it alone fills the limit, so that a fault of its
 * own cannot wedge the cgroup (-1000 would exempt it entirely, as sshd is). A value already lower
 * (set by whoever started tpfs) is kept. Lowering needs CAP_SYS_RESOURCE: a mount without it (a
 * user's, or root's in a container that was not given the capability, as Docker's default set)
 * keeps its score, with an info line in the log saying so: the daemon is then chosen only where it
 * is the largest process of the cgroup (its peak RSS: about 1 MiB a busy worker thread, the plan,
 * its libraries; 35 MiB at most in bench/mem_pressure.py), never beside an engine's processes.
 * Handing the scratch pages back after each reply (MADV_FREE) would make it smaller still, but
 * costs about 40 us per MiB replied here, as much as the copy itself, and busy threads keep
 * theirs: not done. fs->oom_note says which, for the stats file. */
#define OOM_ADJ -999

static void lower_oom_score(tp_fs *fs)
{
	int now = 0;
	FILE *f = fopen("/proc/self/oom_score_adj", "r");
	int known = f && fscanf(f, "%d", &now) == 1;
	if (f)
		fclose(f);
	if (known && now <= OOM_ADJ) {
		tp_fmt(fs->oom_note, sizeof fs->oom_note, "%d (kept: already at most %d)", now, OOM_ADJ);
		return;
	}
	int fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
	char v[16];
	int n = snprintf(v, sizeof v, "%d", OOM_ADJ);
	if (fd >= 0 && write(fd, v, (size_t)n) == n) {
		close(fd);
		tp_fmt(fs->oom_note, sizeof fs->oom_note, "%d (lowered at mount: the OOM killer picks another process "
		       "of the cgroup first)", OOM_ADJ);
		return;
	}
	int err = errno;
	if (fd >= 0)
		close(fd);
	char was[16] = "unknown";
	if (known)
		snprintf(was, sizeof was, "%d", now);
	const char *why = err == EACCES || err == EPERM ? "lowering it needs CAP_SYS_RESOURCE"
							: "/proc/self/oom_score_adj cannot be written";
	tp_fmt(fs->oom_note, sizeof fs->oom_note, "%s (not lowered to %d: %s: %s)", was, OOM_ADJ, why, strerror(err));
	tp_log(1, "oom_score_adj left at %s, not lowered to %d (%s: %s): under a memory limit the kernel's OOM killer "
	       "may choose this daemon, which fails every reader of %s, where it is the largest process", was, OOM_ADJ,
	       why, strerror(err), fs->o->mnt);
}

/* The request threads' priority (--nice; the default TP_NICE_DEFAULT). Every page fault or read that
 * misses the page cache of a served file waits for a thread of the FUSE loop; while an engine's workers
 * keep every core busy (as during a load), a thread woken at their priority waits for a time slice
 * before it runs, and the faulting worker waits with it: measured in docs/PERFORMANCE.md ("Push-ahead").
 * Called on the main thread just before the FUSE loop starts: on Linux nice is per thread and a new
 * thread inherits its creator's, so libfuse's workers (started by this thread, then by each other)
 * take the value, while the push, the watcher and the invalidator, started earlier, keep the
 * inherited one (the push must yield to readers, not compete with them). Raising a priority needs
 * CAP_SYS_NICE; without it the threads keep theirs and the log says so once. Lowering is always
 * allowed. fs->nice_note says which, for the stats file. */
static void set_request_priority(tp_fs *fs)
{
	errno = 0;
	int was = getpriority(PRIO_PROCESS, 0); /* 0: the calling thread, on Linux */
	if (errno)
		was = 0;
	if (fs->o->nice == TP_NICE_KEEP || fs->o->nice == was) {
		tp_fmt(fs->nice_note, sizeof fs->nice_note, "%d (the request threads keep the inherited value%s)", was,
		       fs->o->nice == TP_NICE_KEEP ? ": --nice keep" : "");
		return;
	}
	if (setpriority(PRIO_PROCESS, 0, fs->o->nice) == 0) {
		tp_fmt(fs->nice_note, sizeof fs->nice_note, "%d (the request threads; the push and the other background "
		       "threads keep %d)", fs->o->nice, was);
		return;
	}
	int err = errno;
	const char *why = err == EACCES || err == EPERM ? "raising it needs CAP_SYS_NICE" : "setpriority failed";
	tp_fmt(fs->nice_note, sizeof fs->nice_note, "%d (not set to %d: %s: %s)", was, fs->o->nice, why, strerror(err));
	tp_log(1, "request threads left at nice %d, not %d (%s: %s): while other processes keep every core busy, each "
	       "read of %s that misses the page cache may wait a time slice", was, fs->o->nice, why, strerror(err),
	       fs->o->mnt);
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
	fs.nn = m->tree.nn;
	fs.T = tp_model_ranks(m); /* view ranks: P x T with stages */
	fs.stats_ino = 2 + (fuse_ino_t)fs.T * m->tree.nn;
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
	if (m->view) { /* the part files: their inodes after config.json's, each part's table of sources */
		fs.vnp = tp_model_view_parts(m);
		fs.vpart_ino = fs.stats_ino + 2;
		fs.vloc = calloc((size_t)fs.T * fs.vnp + 1, sizeof *fs.vloc);
		fs.vtab = calloc(fs.vnp + 1, sizeof *fs.vtab);
		fs.vwin = calloc((size_t)fs.T * fs.vnp + 1, sizeof *fs.vwin);
		for (size_t p = 0; fs.vtab && p < fs.vnp; p++) {
			uint32_t nsrc;
			const uint32_t *nodes = tp_model_view_part_nodes(m, p, &nsrc);
			if (!(fs.vtab[p] = calloc(nsrc + 1, sizeof *fs.vtab[p])))
				break;
			for (uint32_t k = 0; k < nsrc; k++) {
				const tp_node *n = &m->tree.n[nodes[k]];
				fs.vtab[p][k] = (tp_src){.fd = n->fd, .map = n->map, .size = n->src_size};
			}
		}
		if (!fs.vloc || !fs.vtab || !fs.vwin || (fs.vnp && !fs.vtab[fs.vnp - 1])) {
			tp_fail(e, TP_ENOMEM, "out of memory");
			goto out_ra;
		}
	}
	fs.hdr = calloc((size_t)m->tree.nn * fs.T, sizeof *fs.hdr);
	if (!fs.hdr) {
		tp_fail(e, TP_ENOMEM, "out of memory");
		goto out_ra;
	}
	fs.ns = calloc(m->tree.nn, sizeof *fs.ns);
	if (!fs.ns) {
		tp_fail(e, TP_ENOMEM, "out of memory");
		goto out_hdr;
	}
	for (uint32_t i = 0; i < m->tree.nn; i++) {
		atomic_init(&fs.ns[i].ctime, ts_ns(m->tree.n[i].ctime));
		atomic_init(&fs.ns[i].mode, (uint32_t)m->tree.n[i].mode);
		atomic_init(&fs.ns[i].uid, (uint32_t)m->tree.n[i].uid);
		atomic_init(&fs.ns[i].gid, (uint32_t)m->tree.n[i].gid);
		if (m->tree.n[i].kind == TN_TENSORS && m->tree.n[i].map && o->source_io == 0) /* no marks: checked each time */
			fs.ns[i].resid = calloc((m->tree.n[i].src_size + RC_CHUNK - 1) / RC_CHUNK + 1, sizeof *fs.ns[i].resid);
	}
	fs.rs = calloc(fs.T, sizeof *fs.rs);
	if (!fs.rs) {
		tp_fail(e, TP_ENOMEM, "out of memory");
		goto out_ns;
	}
	fs.win = calloc((size_t)m->tree.nn * fs.T, sizeof *fs.win);
	if (!fs.win) {
		tp_fail(e, TP_ENOMEM, "out of memory");
		goto out_rs;
	}
	fs.push_budget = push_budget_of(o);
	if (fs.push_budget) { /* lookups counted per inode: the push stores only into looked-up files */
		fs.nlooked = (size_t)fs.stats_ino + 2 + (size_t)fs.T * fs.vnp;
		fs.looked = calloc(fs.nlooked, sizeof *fs.looked);
		if (!fs.looked) {
			tp_fail(e, TP_ENOMEM, "out of memory");
			goto out_win;
		}
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
	struct fuse_lowlevel_ops ops; /* libfuse copies the table */
	memset(&ops, 0, sizeof ops);
	names_ops(&ops);
	read_ops(&ops);
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
	pass_setup(&fs); /* before the loop reads INIT: the custom I/O asks for passthrough */
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
	lower_oom_score(&fs);
	if (open_backend(&fs, e) < 0)
		goto out_helper;
	advise_sources(&fs);
	start_watching(&fs);
	start_push(&fs);
	set_request_priority(&fs);
	struct fuse_loop_config *lc = fuse_loop_cfg_create();
	fuse_loop_cfg_set_max_threads(lc, o->threads ? o->threads : 16);
	fuse_loop_cfg_set_idle_threads(lc, o->threads ? o->threads : 16);
	int lr = fuse_session_loop_mt(fs.se, lc);
	fuse_loop_cfg_destroy(lc);
	stop_push(&fs);
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
	pass_free(&fs);
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
	push_free(&fs);
	free((void *)fs.looked);
	free((void *)fs.win);
out_rs:
	free(fs.rs);
out_ns:
	for (uint32_t i = 0; i < m->tree.nn; i++)
		free((void *)fs.ns[i].resid);
	free(fs.ns);
out_hdr:
	for (size_t k = 0; k < (size_t)m->tree.nn * fs.T; k++)
		free(atomic_load(&fs.hdr[k]));
	free(fs.hdr);
out_ra:
	for (size_t k = 0; fs.vloc && k < (size_t)fs.T * fs.vnp; k++)
		free(atomic_load(&fs.vloc[k]));
	free((void *)fs.vloc);
	for (size_t p = 0; fs.vtab && p < fs.vnp; p++)
		free(fs.vtab[p]);
	free(fs.vtab);
	free((void *)fs.vwin);
	munmap(fs.ra_note, RA_NOTE);
	return rc;
}
