/* fs_pass.c: pushed files served by FUSE passthrough from private copies (--passthrough on).
 *
 * Why: a loader's reads of a file in FUSE's page cache cost about twice what the same reads of an
 * ext4 or tmpfs file cost on kernel 6.18, because FUSE's page cache holds 4 KiB folios where those
 * hold 2 MiB ones (docs/PERFORMANCE.md, "Cached re-reads"); no request reaches the daemon, so
 * nothing the daemon does between reads helps. FUSE passthrough hands the kernel an open file of
 * the daemon's choosing (a backing file) whose reads and mappings then serve the FUSE file's.
 *
 * What: the push thread (fs_push.c) writes a whole served file, made by the read path exactly as a
 * read makes it (push_bytes: every source checked before and after the copy), into an unnamed file
 * (O_TMPFILE) of a tmpfs mounted with huge=always that no one can see (fsopen/fsmount: a mount
 * attached nowhere). Once whole, every open of the served file is answered with that copy as its
 * backing file, as long as no open of it reads through the daemon (the kernel refuses to mix the
 * two on one inode). A copy stays --passthrough-keep seconds after the last passthrough open of its
 * file is released, so that the engine's next start reads it too; where memory runs short
 * (push_memory_short), copies go sooner: those never opened at once, those used PASS_GRACE_MS after
 * that release (the loader has read it: safetensors opens a file twice in a row). A copy that goes
 * moves into FUSE's page cache (reclaimable memory, as without this option): the push thread stores
 * its bytes, read from the copy (checked as a reply's; the source is not read again, and its
 * identity is checked before each store as a read's is), then the copy is freed.
 *
 * The kernel side: libfuse 3.14 cannot ask for passthrough (FUSE_PASSTHROUGH is bit 37 of INIT's
 * flags, libfuse's want field has 32 bits, and its open reply has no backing id), so this room
 * installs libfuse's custom I/O on the session: its read notes whether the kernel's INIT offers
 * passthrough, its writev adds FUSE_PASSTHROUGH and a stack depth of 1 to the INIT reply; open
 * replies carrying a backing id are written with fuse_reply_buf. The backing id comes from the
 * FUSE_DEV_IOC_BACKING_OPEN ioctl (CAP_SYS_ADMIN) at the first passthrough open. Where anything of
 * this is missing (no kernel support, no privilege, no tmpfs), files are served as without the
 * option and the stats file says why.
 *
 * Safety: the copy holds bytes checked exactly as a reply's. A source change drops the copy
 * (pass_revoke, from the invalidation thread): its size becomes 0, so an open file then reads
 * end-of-file (read) or SIGBUS (a mapping), never other bytes; opens after it read through the
 * daemon, which fails them with EIO. Memory: each copy counts against the push budget in whole
 * 2 MiB pages (a copy is made only where the whole file fits), and the tmpfs is no larger than the
 * budget; no copy is made while memory is short. No request handler waits on anything here but
 * this room's mutex (held for table updates and the ioctls, never for a copy).
 */
#include "fs_int.h"

#include <sys/ioctl.h>
#include <sys/mount.h>

/* The kernel's FUSE ABI (7.40+) as far as used here; Debian 12's headers predate it. */
struct k_in_header { uint32_t len, opcode; uint64_t unique, nodeid; uint32_t uid, gid, pid; uint16_t extlen, pad; };
struct k_init_in { uint32_t major, minor, max_readahead, flags, flags2; };
struct k_out_header { uint32_t len; int32_t error; uint64_t unique; };
struct k_open_out { uint64_t fh; uint32_t open_flags; int32_t backing_id; };
struct k_backing_map { int32_t fd; uint32_t flags; uint64_t padding; };
#define K_OP_INIT 26u
#define K_INIT_EXT (1u << 30)
#define K_PASSTHROUGH2 (1u << 5) /* FUSE_PASSTHROUGH, 1 << 37: bit 5 of flags2 */
#define K_INIT_OUT_WORDS 10      /* init_out up to max_stack_depth, in 32-bit words */
#define K_FOPEN_KEEP_CACHE (1u << 1)
#define K_FOPEN_NOFLUSH (1u << 5)
#define K_FOPEN_PASSTHROUGH (1u << 7)
#define K_BACKING_OPEN _IOW(229, 1, struct k_backing_map)
#define K_BACKING_CLOSE _IOW(229, 2, uint32_t)
#define HUGE_PAGE (2u << 20)
#define PASS_GRACE_MS 10000u /* a copy outlives its last passthrough open's release by at least this */
#define PASS_CHECK_MS 1000u  /* pass_expire looks at the copies and the memory at most this often */

/* A copy's states: none yet; being written; serving opens; to move into the page cache (serving no
 * more opens); moving (the push thread has it); gone, or never to be made. */
enum { PS_NONE, PS_FILLING, PS_READY, PS_MOVE, PS_MOVING, PS_OFF };
enum { K_UNKNOWN, K_NO, K_OFFERED, K_ASKED };

typedef struct pentry {
	fuse_ino_t ino;
	uint64_t size, held; /* bytes of the file; bytes of memory its copy holds (whole huge pages) */
	int fd, id;          /* the copy (-1: none), its backing id (0: none yet) */
	uint32_t npass, ncache; /* opens served from the copy, and through the daemon */
	uint8_t state, used; /* PS_*; a passthrough open has been made */
	uint64_t idle_since; /* ms (CLOCK_MONOTONIC) its last passthrough open was released; 0: one is open */
} pentry;

struct pass_tab {
	pthread_mutex_t lock;
	pentry *e; /* sorted by ino */
	size_t n;
	int mnt;   /* the tmpfs, attached nowhere */
	_Atomic uint64_t init_unique; /* the INIT request's, 0 before it */
	_Atomic int kernel;           /* K_UNKNOWN before INIT, then K_NO, K_OFFERED or K_ASKED */
	_Atomic int warned;           /* a failed backing open was logged */
	_Atomic uint64_t opens, copies, moves, squeezed, revokes; /* squeezed: moves because memory was short */
	_Atomic uint32_t gen;         /* bumped whenever a copy is to move: the push thread looks for work */
	_Atomic int short_mem;        /* memory was short at the last look (no new copies then) */
	uint64_t looked_ms;           /* when pass_expire last looked (the push thread's alone) */
	char note[200];               /* why passthrough is not used, or "" */
};

static ssize_t io_read(int fd, void *buf, size_t len, void *ud)
{
	tp_fs *fs = ud;
	ssize_t got = read(fd, buf, len);
	if (got >= (ssize_t)(sizeof(struct k_in_header) + sizeof(struct k_init_in)) && fs->pass &&
	    !atomic_load(&fs->pass->init_unique)) {
		const struct k_in_header *h = buf;
		if (h->opcode == K_OP_INIT) {
			const struct k_init_in *in = (const void *)(h + 1);
			int offered = (in->flags & K_INIT_EXT) && (in->flags2 & K_PASSTHROUGH2);
			atomic_store(&fs->pass->kernel, offered ? K_OFFERED : K_NO);
			atomic_store(&fs->pass->init_unique, h->unique);
		}
	}
	return got;
}

static ssize_t io_writev(int fd, struct iovec *iov, int count, void *ud)
{
	tp_fs *fs = ud;
	struct pass_tab *t = fs->pass;
	if (t && count >= 2 && iov[0].iov_len >= sizeof(struct k_out_header) && atomic_load(&t->kernel) == K_OFFERED &&
	    iov[1].iov_len >= K_INIT_OUT_WORDS * 4) {
		const struct k_out_header *oh = iov[0].iov_base;
		uint64_t u = atomic_load(&t->init_unique);
		if (u && oh->unique == u && oh->error == 0) {
			uint32_t *w = iov[1].iov_base; /* major, minor, readahead, flags, ..., flags2 [8], stack depth [9] */
			w[3] |= K_INIT_EXT;
			w[8] |= K_PASSTHROUGH2;
			w[9] = 1;
			atomic_store(&t->kernel, K_ASKED);
		}
	}
	return writev(fd, iov, count);
}

static uint64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static int cmp_ino(const void *a, const void *b)
{
	const pentry *x = a, *y = b;
	return x->ino < y->ino ? -1 : x->ino > y->ino;
}

static pentry *find(struct pass_tab *t, fuse_ino_t ino)
{
	pentry key = {.ino = ino};
	return t ? bsearch(&key, t->e, t->n, sizeof *t->e, cmp_ino) : NULL;
}

void pass_setup(tp_fs *fs)
{
	if (!fs->o->passthrough || !fs->push_budget)
		return;
	struct pass_tab *t = calloc(1, sizeof *t);
	if (!t) {
		tp_log(0, "--passthrough: out of memory; files are served as without it");
		return;
	}
	pthread_mutex_init(&t->lock, NULL);
	t->mnt = -1;
	char size[32];
	snprintf(size, sizeof size, "%llu", (unsigned long long)(fs->push_budget + HUGE_PAGE));
	int fsfd = fsopen("tmpfs", FSOPEN_CLOEXEC);
	if (fsfd < 0 || fsconfig(fsfd, FSCONFIG_SET_STRING, "huge", "always", 0) < 0 ||
	    fsconfig(fsfd, FSCONFIG_SET_STRING, "size", size, 0) < 0 ||
	    fsconfig(fsfd, FSCONFIG_SET_STRING, "mode", "0700", 0) < 0 || fsconfig(fsfd, FSCONFIG_CMD_CREATE, NULL, NULL, 0) < 0 ||
	    (t->mnt = fsmount(fsfd, FSMOUNT_CLOEXEC, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC)) < 0)
		snprintf(t->note, sizeof t->note, "no private tmpfs for the copies (%s; mounting one needs CAP_SYS_ADMIN)",
			 strerror(errno));
	if (fsfd >= 0)
		close(fsfd);
	struct fuse_custom_io io = {.read = io_read, .writev = io_writev};
	if (t->mnt >= 0 && fuse_session_custom_io(fs->se, &io, fuse_session_fd(fs->se)) != 0)
		snprintf(t->note, sizeof t->note, "libfuse refused the custom I/O that asks the kernel for it");
	if (t->note[0])
		tp_log(0, "--passthrough: %s; files are served as without it", t->note);
	fs->pass = t;
}

int pass_table(tp_fs *fs, const fuse_ino_t *ino, const uint64_t *size, size_t n)
{
	struct pass_tab *t = fs->pass;
	if (!t || t->note[0])
		return 0;
	t->e = calloc(n + 1, sizeof *t->e);
	if (!t->e)
		return -1;
	for (size_t k = 0; k < n; k++)
		t->e[k] = (pentry){.ino = ino[k], .size = size[k], .fd = -1, .state = PS_NONE};
	qsort(t->e, n, sizeof *t->e, cmp_ino);
	t->n = n;
	return 0;
}

int pass_on(const tp_fs *fs)
{
	return fs->pass && fs->pass->n && !fs->pass->note[0];
}

/* The memory a copy of size bytes holds: whole huge pages. */
static uint64_t held_of(uint64_t size)
{
	return (size + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;
}

int pass_claim(tp_fs *fs, fuse_ino_t ino)
{
	struct pass_tab *t = fs->pass;
	pentry *p = pass_on(fs) ? find(t, ino) : NULL;
	if (!p || p->state != PS_NONE || atomic_load(&t->kernel) == K_NO || atomic_load(&t->short_mem))
		return 0;
	uint64_t held = held_of(p->size), done = atomic_load(&fs->pushed);
	if (done + held > fs->push_budget)
		return 0;
	int fd = openat(t->mnt, ".", O_TMPFILE | O_RDWR | O_CLOEXEC, 0400);
	if (fd < 0 || ftruncate(fd, (off_t)p->size) < 0) {
		if (fd >= 0)
			close(fd);
		return 0;
	}
	pthread_mutex_lock(&t->lock);
	p->fd = fd;
	p->held = held;
	p->state = PS_FILLING;
	pthread_mutex_unlock(&t->lock);
	atomic_fetch_add(&fs->pushed, held);
	return 1;
}

int pass_fill(tp_fs *fs, fuse_ino_t ino, uint64_t off, const uint8_t *buf, uint64_t len)
{
	pentry *p = find(fs->pass, ino);
	for (uint64_t k = 0; p && k < len;) {
		ssize_t w = pwrite(p->fd, buf + k, len - k, (off_t)(off + k));
		if (w <= 0)
			return w < 0 ? errno : EIO;
		k += (uint64_t)w;
	}
	return p ? 0 : ENOENT;
}

/* Frees p's copy (t->lock held): its backing id, its file, its memory from the push's count. */
static void drop_copy(tp_fs *fs, pentry *p)
{
	if (p->id > 0)
		ioctl(fuse_session_fd(fs->se), K_BACKING_CLOSE, &(uint32_t){(uint32_t)p->id});
	if (p->fd >= 0)
		close(p->fd);
	p->fd = -1;
	p->id = 0;
	atomic_fetch_sub(&fs->pushed, p->held);
	p->held = 0;
}

void pass_end_file(tp_fs *fs, fuse_ino_t ino, int whole)
{
	struct pass_tab *t = fs->pass;
	pentry *p = find(t, ino);
	if (!p)
		return;
	pthread_mutex_lock(&t->lock);
	if (p->state == PS_FILLING && whole) {
		p->state = PS_READY;
		atomic_fetch_add(&t->copies, 1);
	} else if (p->state == PS_FILLING) { /* a changed source, or the push stopped: no copy */
		drop_copy(fs, p);
		p->state = PS_OFF;
	}
	pthread_mutex_unlock(&t->lock);
}

int pass_open(tp_fs *fs, fuse_req_t req, fuse_ino_t ino)
{
	struct pass_tab *t = fs->pass;
	pentry *p = find(t, ino);
	if (!p)
		return 0;
	pthread_mutex_lock(&t->lock);
	if (p->state == PS_READY && !p->ncache && !p->id) {
		struct k_backing_map map = {.fd = p->fd};
		int id = ioctl(fuse_session_fd(fs->se), K_BACKING_OPEN, &map);
		if (id > 0)
			p->id = id;
		else {
			if (!atomic_exchange(&t->warned, 1))
				tp_log(0, "--passthrough: the kernel refused a backing file (%s); files are read through "
				       "the daemon", strerror(errno));
			p->state = PS_MOVE; /* into the page cache, from the copy */
			atomic_fetch_add(&t->gen, 1);
		}
	}
	int pass = p->state == PS_READY && !p->ncache && p->id > 0;
	if (pass) {
		p->npass++;
		p->used = 1;
		p->idle_since = 0;
		atomic_fetch_add(&t->opens, 1);
	} else
		p->ncache++;
	int id = p->id;
	pthread_mutex_unlock(&t->lock);
	if (!pass)
		return 0;
	struct k_open_out out = {.fh = PASS_FH, .open_flags = K_FOPEN_PASSTHROUGH | K_FOPEN_NOFLUSH, .backing_id = id};
	fuse_reply_buf(req, (const char *)&out, sizeof out);
	return 1;
}

void pass_release(tp_fs *fs, fuse_ino_t ino, uint64_t fh)
{
	struct pass_tab *t = fs->pass;
	pentry *p = find(t, ino);
	if (!p)
		return;
	pthread_mutex_lock(&t->lock);
	if (fh == PASS_FH && p->npass)
		p->npass--;
	else if (fh != PASS_FH && p->ncache)
		p->ncache--;
	if (fh == PASS_FH && !p->npass && p->state == PS_READY) /* the loader may be done with it: pass_expire */
		p->idle_since = now_ms();
	pthread_mutex_unlock(&t->lock);
}

void pass_expire(tp_fs *fs)
{
	struct pass_tab *t = fs->pass;
	if (!t || !t->n)
		return;
	uint64_t now = now_ms(), keep = (uint64_t)fs->o->pass_keep * 1000u;
	uint64_t grace = keep < PASS_GRACE_MS ? keep : PASS_GRACE_MS;
	if (t->looked_ms && now - t->looked_ms < PASS_CHECK_MS)
		return;
	t->looked_ms = now;
	int tight = push_memory_short();
	atomic_store(&t->short_mem, tight);
	pthread_mutex_lock(&t->lock);
	for (size_t k = 0; k < t->n; k++) {
		pentry *p = &t->e[k];
		if (p->state != PS_READY || p->npass)
			continue;
		uint64_t idle = p->idle_since ? now - p->idle_since : 0;
		int kept = p->used && p->idle_since && idle >= keep;
		int squeeze = tight && (!p->used || (p->idle_since && idle >= grace));
		if (!kept && !squeeze)
			continue;
		if (p->id > 0) /* no open is served from it from here on: new opens read through the daemon */
			ioctl(fuse_session_fd(fs->se), K_BACKING_CLOSE, &(uint32_t){(uint32_t)p->id});
		p->id = 0;
		p->state = PS_MOVE;
		atomic_fetch_add(&t->moves, 1);
		if (!kept)
			atomic_fetch_add(&t->squeezed, 1);
		atomic_fetch_add(&t->gen, 1);
	}
	pthread_mutex_unlock(&t->lock);
}

void pass_revoke(tp_fs *fs, fuse_ino_t ino)
{
	struct pass_tab *t = fs->pass;
	pentry *p = find(t, ino);
	if (!p)
		return;
	pthread_mutex_lock(&t->lock);
	if (p->fd >= 0) {
		if (ftruncate(p->fd, 0) < 0) /* open files read end-of-file from here on */
			tp_log(0, "--passthrough: cannot empty a changed file's copy (%s)", strerror(errno));
		drop_copy(fs, p);
		atomic_fetch_add(&t->revokes, 1);
	}
	p->state = PS_OFF;
	pthread_mutex_unlock(&t->lock);
}

uint32_t pass_gen(const tp_fs *fs)
{
	return fs->pass ? atomic_load(&fs->pass->gen) : 0;
}

int pass_move(tp_fs *fs, fuse_ino_t ino)
{
	struct pass_tab *t = fs->pass;
	pentry *p = find(t, ino);
	if (!p)
		return -1;
	pthread_mutex_lock(&t->lock);
	int fd = p->state == PS_MOVE ? fcntl(p->fd, F_DUPFD_CLOEXEC, 0) : -1;
	if (fd >= 0)
		p->state = PS_MOVING;
	pthread_mutex_unlock(&t->lock);
	return fd;
}

void pass_moved(tp_fs *fs, fuse_ino_t ino)
{
	struct pass_tab *t = fs->pass;
	pentry *p = find(t, ino);
	if (!p)
		return;
	pthread_mutex_lock(&t->lock);
	if (p->state == PS_MOVING) {
		drop_copy(fs, p);
		p->state = PS_OFF; /* from here on in the page cache, like any file */
	}
	pthread_mutex_unlock(&t->lock);
}

size_t pass_text(tp_fs *fs, char *b, size_t cap)
{
	struct pass_tab *t = fs->pass;
	if (!fs->o->passthrough)
		return (size_t)snprintf(b, cap, "passthrough: off\n");
	if (!t || t->note[0] || !t->n)
		return (size_t)snprintf(b, cap, "passthrough: not used: %s\n",
					t && t->note[0] ? t->note : !fs->push_budget ? "the push is off" : "no files to push");
	if (atomic_load(&t->kernel) == K_NO)
		return (size_t)snprintf(b, cap, "passthrough: not used: the kernel does not offer FUSE passthrough\n");
	return (size_t)snprintf(b, cap, "passthrough: %llu copies made, %llu opens served from them, %llu moved into the "
				"page cache (%llu with memory short), %llu dropped at a source change; copies stay %us "
				"after use\n",
				(unsigned long long)atomic_load(&t->copies),
				(unsigned long long)atomic_load(&t->opens),
				(unsigned long long)atomic_load(&t->moves),
				(unsigned long long)atomic_load(&t->squeezed),
				(unsigned long long)atomic_load(&t->revokes), (unsigned)fs->o->pass_keep);
}

void pass_free(tp_fs *fs)
{
	struct pass_tab *t = fs->pass;
	if (!t)
		return;
	for (size_t k = 0; k < t->n; k++)
		if (t->e[k].fd >= 0)
			close(t->e[k].fd);
	if (t->mnt >= 0)
		close(t->mnt);
	pthread_mutex_destroy(&t->lock);
	free(t->e);
	free(t);
	fs->pass = NULL;
}
