/* fs_push.c: push-ahead (issue 46): a thread of its own fills the kernel's page cache of the files
 * this node serves, so that a loader's reads are page-cache hits instead of requests to the daemon
 * (FUSE copies every reply twice; a cached page costs one copy).
 *
 * What is pushed: every served tensor file (a rank folder's) or part file (a view's), in the
 * order loaders read them: files in name order, the ranks of one file side by side (the ranks'
 * loaders run at once), each file from its header on, in chunks of at most PUSH_CHUNK. Each chunk
 * is made by the read path itself (push_bytes in fs_read.c: the same runs, the same checks of
 * every source before and after the copy, the same release of the daemon's source pages) into
 * this thread's own buffer, and stored with fuse_lowlevel_notify_store. The source pages a chunk
 * needs that are not in the page cache are read with O_DIRECT into the thread's staging buffer
 * (--push-io direct, and auto where one rank is served: fs_resid.c's stage_cold), not prefetched into
 * the source's page cache and copied from the mapping as a read's are (--push-io map, and auto where
 * more ranks are served: their pushes then share the source pages their cuts have in common, which
 * direct reads, caching nothing, would fetch once per rank). A changed source pushes
 * nothing more and fails its files, as a read would; a change after a push drops the pushed pages
 * with every other cached page (fs_watch.c invalidates the served inodes).
 *
 * Bounded: at most fs->push_budget bytes in all (--push SIZE or auto: fs_mem.c); demand reads
 * first: between chunks the thread sleeps while any read is in flight, and what reads have replied
 * (fs_read.c's note_replied: a loader that overtook the push, on slow storage) is skipped, not
 * stored again (the stats count it). A file pushed whole sets its prefetch window to the whole file
 * (push_whole), and while the push reads with O_DIRECT reads fetch nothing ahead
 * (fs->push_reading): what the push fetches, reads do not fetch again.
 *
 * With --passthrough, a copy whose time is up (fs_pass.c, pass_expire) moves into the page cache
 * here: its bytes read from the copy (move_chunk), stored as a push's, the copy then freed.
 *
 * The kernel stores only into an inode it knows (one it has looked up; otherwise the store fails
 * with ENOENT): a file is pushed once a lookup of it has been answered (fs_names.c counts them in
 * fs->looked, no request waits on the push), and the ready helper (fs_session.c) looks every
 * served file up once the mount answers, so pushing starts before the loader opens anything.
 * An inode the kernel has forgotten since (memory pressure) fails with ENOENT and is pushed on
 * when it is looked up again. No request handler ever waits on this thread.
 *
 * Ending: a store waits for any page a READ in flight holds locked, and once the loop has ended
 * nobody answers that READ (libfuse's workers may even drop a request they have read as they
 * exit): a store then waits until the connection is aborted, which its own write to the device
 * prevents. So the push ends while the workers still serve: with the push running, SIGTERM,
 * SIGINT and SIGHUP first stop the push thread, which then ends the loop by raising the signal
 * again (a second signal ends the loop at once, as without the push); an unmount ends the loop
 * only after the kernel has aborted the connection, where stores fail at once.
 */
#include "fs_int.h"

#define PUSH_CHUNK (1u << 20) /* most bytes one store carries */
#define PUSH_IDLE_MS 1000u    /* longest sleep while no file can be pushed (none looked up yet) */
#define PUSH_ENOENT_TRIES 3   /* stores failing with ENOENT before a file waits for its next lookup */

typedef struct pfile {
	fuse_ino_t ino;
	uint64_t size;     /* bytes of the file */
	uint64_t next;     /* pushed up to here */
	uint32_t seen;     /* fs->looked[ino] when a store last failed with ENOENT */
	uint8_t tries;     /* stores failed with ENOENT since the file's last lookup */
	uint8_t state;     /* PF_TODO, PF_DONE, PF_FAILED */
	uint8_t copy;      /* pushed into a copy for passthrough (fs_pass.c), not the page cache */
	int from1;         /* 1 + the descriptor of its copy while the copy moves into the page cache; 0 */
} pfile;

enum { PF_TODO, PF_DONE, PF_FAILED };
enum { PUSH_ON, PUSH_WAIT, PUSH_END }; /* push_file: go on with the next file, or end the push;
                                        * copy_chunk: PUSH_WAIT, go on with this file */

static void sleep_ms(unsigned ms)
{
	struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
	nanosleep(&t, NULL);
}

/* One chunk of file pf (pushed into its copy, fs_pass.c) at pf->next: PUSH_WAIT when it went on
 * (pf->next advanced), else what push_file returns (the copy abandoned: a changed source fails the
 * file; a passing shortage leaves it to the page cache's push later). The copy's memory was counted
 * whole when it was claimed. */
static int copy_chunk(tp_fs *fs, push_stage *ps, pfile *pf, uint64_t *moved)
{
	while (atomic_load_explicit(&fs->reads_now, memory_order_relaxed) > 0 && !atomic_load(&fs->push_stop))
		sleep_ms(1); /* demand reads first */
	if (atomic_load(&fs->push_stop)) {
		pass_end_file(fs, pf->ino, 0);
		return PUSH_END;
	}
	uint64_t len = pf->size - pf->next < PUSH_CHUNK ? pf->size - pf->next : PUSH_CHUNK, touched = 0;
	const uint8_t *buf;
	int err = push_bytes(fs, ps, pf->ino, pf->next, len, &buf, &touched);
	if (!err) {
		err = pass_fill(fs, pf->ino, pf->next, buf, len);
		push_stored(fs, pf->ino, err ? 0 : touched);
	}
	if (err) {
		pass_end_file(fs, pf->ino, 0);
		pf->copy = 0;
		pf->next = 0;
		if (!transient(err) && err != ENOSPC)
			pf->state = PF_FAILED; /* a changed source (marked and logged as for a read) */
		return PUSH_ON;
	}
	pf->next += len;
	*moved += len;
	return PUSH_WAIT;
}

/* Stores len bytes at buf into the page cache of file pf at pf->next (touched: the source bytes they
 * were made of, for the stats; the pushed bytes count against the budget). PUSH_WAIT when stored
 * (pf->next advanced), PUSH_ON when the kernel does not know the inode (the file waits for a lookup),
 * PUSH_END when the connection has ended or the kernel refuses stores. */
static int store_chunk(tp_fs *fs, pfile *pf, const uint8_t *buf, uint64_t len, uint64_t touched, uint64_t *moved)
{
	struct fuse_bufvec bv = FUSE_BUFVEC_INIT(len);
	bv.buf[0].mem = (void *)buf;
	int rc = fuse_lowlevel_notify_store(fs->se, pf->ino, (off_t)pf->next, &bv, 0);
	push_stored(fs, pf->ino, rc == 0 ? touched : 0);
	if (rc == -ENOENT) { /* the kernel does not know the inode (yet, or any more) */
		uint32_t seen = atomic_load_explicit(&fs->looked[pf->ino], memory_order_relaxed);
		pf->tries = seen == pf->seen ? pf->tries + 1 : 1;
		pf->seen = seen;
		return PUSH_ON;
	}
	if (rc == -ENODEV || rc == -EBADF) /* the connection has ended: unmounting */
		return PUSH_END;
	if (rc < 0) {
		tp_log(0, "push-ahead stopped: the kernel refused to store pages (%s); reads are served as without it",
		       strerror(-rc));
		return PUSH_END;
	}
	pf->tries = 0;
	atomic_fetch_add(&fs->pushed, len);
	pf->next += len;
	*moved += len;
	return PUSH_WAIT;
}

/* The end of a copy's move into the page cache (done: every byte stored): the copy goes. */
static void end_move(tp_fs *fs, pfile *pf, int done)
{
	close(pf->from1 - 1);
	pf->from1 = 0;
	pass_moved(fs, pf->ino);
	if (done)
		push_whole(fs, pf->ino);
	pf->state = done ? PF_DONE : PF_FAILED;
}

/* One chunk of file pf moved from its copy (fs_pass.c, pass_move) into the page cache at pf->next:
 * the copy holds bytes checked as a reply's, so its source is not read again; a store after a
 * source change is what the read path guards against (push_check before, push_stored's after_reply
 * after). The copy's memory is counted until the move ends; the stores are counted too but do not
 * wait for the budget (the memory moves, at most a file's more for the while). Returns as
 * store_chunk, or PUSH_ON where the file failed (its copy was emptied or its source changed). */
static uint8_t *move_buf; /* move_chunk's (one mount per process; freed as the push thread ends) */

static int move_chunk(tp_fs *fs, pfile *pf, uint64_t *moved)
{
	uint8_t *buf = move_buf ? move_buf : (move_buf = malloc(PUSH_CHUNK));
	if (!buf)
		return PUSH_ON; /* out of memory for now: this file again later */
	while (atomic_load_explicit(&fs->reads_now, memory_order_relaxed) > 0 && !atomic_load(&fs->push_stop))
		sleep_ms(1); /* demand reads first */
	if (atomic_load(&fs->push_stop))
		return PUSH_END;
	uint64_t len = pf->size - pf->next < PUSH_CHUNK ? pf->size - pf->next : PUSH_CHUNK;
	ssize_t got = pread(pf->from1 - 1, buf, len, (off_t)pf->next); /* 0 from a copy a source change emptied */
	int err = got == (ssize_t)len ? push_check(fs, pf->ino) : EIO;
	if (err && transient(err))
		return PUSH_ON;
	if (err) {
		end_move(fs, pf, 0);
		return PUSH_ON;
	}
	int r = store_chunk(fs, pf, buf, len, 0, moved);
	if (r == PUSH_WAIT && pf->next == pf->size) {
		end_move(fs, pf, 1);
		return PUSH_ON;
	}
	return r;
}

/* The bytes of file pf from pf->next on that reads have replied (whole REPLIED_UNIT blocks, up to the
 * file's end), which the push skips; 0 where pf->next is inside a block. */
static uint64_t replied_from(const tp_fs *fs, const pfile *pf)
{
	_Atomic uint64_t *map = fs->replied ? fs->replied[pf->ino] : NULL;
	if (!map || pf->next % REPLIED_UNIT)
		return 0;
	uint64_t u = pf->next / REPLIED_UNIT, end = (pf->size + REPLIED_UNIT - 1) / REPLIED_UNIT;
	while (u < end && (atomic_load_explicit(&map[u / 64], memory_order_relaxed) >> (u % 64) & 1))
		u++;
	uint64_t to = u * REPLIED_UNIT < pf->size ? u * REPLIED_UNIT : pf->size;
	return to - pf->next;
}

/* Pushes file pf on from pf->next, chunk after chunk, until it is whole, fails, the budget is
 * spent or the thread is told to stop. Returns PUSH_ON (go on with the next file: this one is
 * whole, failed, or waits for a lookup or a passing shortage), or PUSH_END. *moved: bytes stored. */
static int push_file(tp_fs *fs, push_stage *ps, pfile *pf, uint64_t *moved)
{
	const uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
	while (pf->next < pf->size) {
		if (pf->from1) {
			int r = move_chunk(fs, pf, moved);
			if (r != PUSH_WAIT)
				return r;
			continue;
		}
		if (pf->copy) {
			int r = copy_chunk(fs, ps, pf, moved);
			if (r != PUSH_WAIT)
				return r;
			continue;
		}
		while (atomic_load_explicit(&fs->reads_now, memory_order_relaxed) > 0 && !atomic_load(&fs->push_stop))
			sleep_ms(1); /* demand reads first */
		if (atomic_load(&fs->push_stop))
			return PUSH_END;
		uint64_t skip = replied_from(fs, pf); /* in the page cache already: a read replied it */
		if (skip) {
			pf->next += skip;
			atomic_fetch_add(&fs->push_skipped, skip);
			continue;
		}
		uint64_t done = atomic_load(&fs->pushed), left = done < fs->push_budget ? fs->push_budget - done : 0;
		uint64_t len = pf->size - pf->next < PUSH_CHUNK ? pf->size - pf->next : PUSH_CHUNK;
		if (len > left) /* the budget's last pages (a partial page only at the file's end) */
			len = left / page * page;
		if (!len)
			return PUSH_END;
		const uint8_t *buf;
		uint64_t touched = 0;
		int err = push_bytes(fs, ps, pf->ino, pf->next, len, &buf, &touched);
		if (err) {
			if (transient(err))
				return PUSH_ON; /* out of memory or descriptors for now: this file again later */
			pf->state = PF_FAILED; /* a changed source (marked and logged as for a read) */
			return PUSH_ON;
		}
		int r = store_chunk(fs, pf, buf, len, touched, moved);
		if (r != PUSH_WAIT)
			return r;
	}
	if (pf->copy)
		pass_end_file(fs, pf->ino, 1);
	else
		push_whole(fs, pf->ino);
	pf->state = PF_DONE;
	return PUSH_ON;
}

/* Orders pfiles by file, then rank (push_list has them carry that order as next until the push
 * begins). */
static int cmp_ord(const void *a, const void *b)
{
	const pfile *x = a, *y = b;
	return x->next < y->next ? -1 : x->next > y->next;
}

static const tp_model *sort_model; /* for cmp_path (set under push_list's single caller) */

static int cmp_path(const void *a, const void *b)
{
	return strcmp(sort_model->tree.n[*(const uint32_t *)a].path, sort_model->tree.n[*(const uint32_t *)b].path);
}

/* The files to push, in the order loaders read them (*n of them; NULL when out of memory); sets
 * fs->push_total to their bytes. */
static pfile *push_list(tp_fs *fs, size_t *n)
{
	const tp_model *m = fs->m;
	size_t cap = fs->vnp ? (size_t)fs->T * fs->vnp : (size_t)fs->T * fs->nn, k = 0;
	pfile *l = calloc(cap + 1, sizeof *l);
	if (!l)
		return NULL;
	if (fs->vnp) { /* part p of every served rank, then part p + 1 */
		for (size_t p = 0; p < fs->vnp; p++)
			for (uint32_t r = 0; r < fs->T; r++) {
				tp_view_file vf;
				if (served(fs, r) && tp_model_view_file(m, r, p, &vf))
					l[k++] = (pfile){.ino = fs->vpart_ino + (fuse_ino_t)r * fs->vnp + p,
							 .size = vf.layout->size};
			}
	} else { /* each tensor file in name order, every served rank's copy of it */
		uint32_t *ord = calloc(fs->nn + 1, sizeof *ord), no = 0;
		if (!ord) {
			free(l);
			return NULL;
		}
		for (uint32_t i = 0; i < fs->nn; i++)
			if (m->tree.n[i].kind == TN_TENSORS)
				ord[no++] = i;
		sort_model = m;
		qsort(ord, no, sizeof *ord, cmp_path);
		for (uint32_t j = 0; j < no; j++)
			for (uint32_t r = 0; r < fs->T; r++)
				if (served(fs, r))
					l[k++] = (pfile){.ino = ino_of(fs, r, ord[j]), .size = tp_node_size(m, ord[j], r),
							 .next = (uint64_t)j * fs->T + r};
		qsort(l, k, sizeof *l, cmp_ord);
		for (size_t j = 0; j < k; j++)
			l[j].next = 0;
		free(ord);
	}
	uint64_t total = 0;
	for (size_t j = 0; j < k; j++)
		total += l[j].size;
	atomic_store(&fs->push_total, total);
	*n = k;
	return l;
}

static pfile *push_l; /* the list start_push made for the thread (one mount per process) */
static size_t push_n;

/* With copies (fs_pass.c), once every file is pushed: waits until a copy is to move into the page
 * cache (pass_expire) or the push is told to stop. Returns 1 when
 * there is work again. push_done is set while waiting: a signal then ends the loop at once (on_term
 * sets push_stop before it reads push_done; this clears push_done before it reads push_stop, so one
 * of them sees the other). */
static int wait_for_drop(tp_fs *fs, uint32_t gen)
{
	atomic_store(&fs->push_done, 1);
	while (!atomic_load(&fs->push_stop) && pass_gen(fs) == gen) {
		sleep_ms(20);
		pass_expire(fs);
	}
	atomic_store(&fs->push_done, 0);
	return !atomic_load(&fs->push_stop);
}

static void *push_thread(void *arg)
{
	tp_fs *fs = arg;
	size_t n = push_n;
	pfile *l = push_l;
	push_stage stage, *ps = NULL; /* --push-io direct: cold source pages read with O_DIRECT (fs_resid.c) */
	uint32_t nranks = fs->o->serve ? fs->o->nserve : fs->T; /* auto: direct for one rank (O_DIRECT reads share no page) */
	if ((fs->o->push_io == 0 || (fs->o->push_io < 0 && nranks == 1)) && stage_init(&stage, fs->nn) == 0)
		ps = &stage;
	atomic_store(&fs->push_reading, ps != NULL); /* reads fetch nothing ahead while this reads (fs_resid.c) */
	unsigned idle = 1;
	while (!atomic_load(&fs->push_stop)) {
		uint64_t moved = 0;
		size_t todo = 0;
		int end = 0;
		pass_expire(fs);
		uint32_t gen = pass_gen(fs);
		for (size_t k = 0; gen && k < n; k++) { /* copies kept long enough, or memory short: into the page cache */
			int fd = l[k].state == PF_DONE ? pass_move(fs, l[k].ino) : -1;
			if (fd >= 0)
				l[k] = (pfile){.ino = l[k].ino, .size = l[k].size, .state = PF_TODO, .from1 = fd + 1};
		}
		for (size_t k = 0; k < n && !end; k++) {
			pfile *pf = &l[k];
			if (pf->state != PF_TODO)
				continue;
			todo++;
			if (pf->next == 0 && !pf->copy && pass_claim(fs, pf->ino))
				pf->copy = 1;
			uint32_t seen = atomic_load_explicit(&fs->looked[pf->ino], memory_order_relaxed);
			if (!pf->copy && (!seen || (pf->tries >= PUSH_ENOENT_TRIES && seen == pf->seen)))
				continue; /* not known to the kernel: waits for a lookup */
			end = push_file(fs, ps, pf, &moved) == PUSH_END;
		}
		if (!todo)
			atomic_store(&fs->push_reading, 0); /* every file pushed (or failed): reads fetch ahead again */
		if (!end && !todo && pass_on(fs) && wait_for_drop(fs, gen))
			continue;
		if (end || !todo)
			break;
		idle = moved ? 1 : idle * 2 > PUSH_IDLE_MS ? PUSH_IDLE_MS : idle * 2;
		for (unsigned t = 0; !moved && t < idle && !atomic_load(&fs->push_stop); t += 10)
			sleep_ms(idle - t < 10 ? idle - t : 10);
	}
	for (size_t k = 0; k < n; k++)
		if (l[k].from1) /* a move the end of the push cut short: the copy stays until the unmount */
			close(l[k].from1 - 1);
	free(l);
	free(move_buf);
	move_buf = NULL;
	if (ps)
		stage_free(ps);
	push_l = NULL;
	atomic_store(&fs->push_reading, 0);
	atomic_store(&fs->push_done, 1);
	if (atomic_load(&fs->push_term)) /* a signal waits for the push to end: the loop ends now */
		pthread_kill(fs->loop_thread, SIGTERM);
	return NULL;
}

/* The mount whose push a signal stops first (one mount per process). */
static tp_fs *term_fs;

/* SIGTERM, SIGINT and SIGHUP while the push may run: the first stops the push thread and leaves the
 * loop to it (it raises SIGTERM at the loop's thread when it has ended); the loop ends here once the
 * push has ended, or at a second signal. Async-signal-safe: lock-free atomics and
 * fuse_session_exit (a store of a flag, as libfuse's own handler calls it). */
static void on_term(int sig)
{
	(void)sig;
	tp_fs *fs = term_fs;
	if (!fs)
		return;
	atomic_store(&fs->push_stop, 1);
	int again = atomic_exchange(&fs->push_term, 1);
	if (again || atomic_load(&fs->push_done))
		fuse_session_exit(fs->se);
}

void start_push(tp_fs *fs)
{
	if (!fs->push_budget || !fs->looked)
		return;
	push_l = push_list(fs, &push_n);
	if (!push_l) {
		tp_log(0, "push-ahead: out of memory; reads are served as without it");
		return;
	}
	fs->replied = calloc(fs->nlooked, sizeof *fs->replied); /* freed by push_free, after the loop */
	for (size_t k = 0; fs->replied && k < push_n; k++)
		if (push_l[k].ino < fs->nlooked) /* none where out of memory: that file's replies are stored again */
			fs->replied[push_l[k].ino] = calloc((push_l[k].size / REPLIED_UNIT + 64) / 64, sizeof(uint64_t));
	if (fs->pass) { /* the files that may get a copy: the same list */
		fuse_ino_t *ino = calloc(push_n + 1, sizeof *ino);
		uint64_t *size = calloc(push_n + 1, sizeof *size);
		for (size_t k = 0; ino && size && k < push_n; k++)
			ino[k] = push_l[k].ino, size[k] = push_l[k].size;
		if (!ino || !size || pass_table(fs, ino, size, push_n) < 0)
			tp_log(0, "--passthrough: out of memory; files are served as without it");
		free(ino);
		free(size);
	}
	fs->loop_thread = pthread_self();
	if (start_thread(&fs->pusher, push_thread, fs) != 0) {
		tp_log(0, "cannot start the push-ahead thread (%s); reads are served as without it", strerror(errno));
		free(push_l);
		push_l = NULL;
		return;
	}
	fs->pushing = 1;
	term_fs = fs;
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_term;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGHUP, &sa, NULL);
}

void push_free(tp_fs *fs)
{
	for (size_t k = 0; fs->replied && k < fs->nlooked; k++)
		free((void *)fs->replied[k]);
	free(fs->replied);
	fs->replied = NULL;
}

void stop_push(tp_fs *fs)
{
	atomic_store(&fs->push_stop, 1);
	if (!fs->pushing)
		return;
	pthread_join(fs->pusher, NULL);
	fs->pushing = 0;
	term_fs = NULL; /* a later signal is ignored by on_term (the loop has ended) */
}
