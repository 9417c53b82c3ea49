/* fs_int.h: what the rooms of the filesystem layer share (fs_log, fs_names, fs_read, fs_watch,
 * fs_push, fs_session): the state of a mount, per node and per rank, and the functions one room
 * offers the others. Only these files and cli.c include libfuse's headers (through fs.h, cli.c does not);
 * nothing below the filesystem includes this.
 */
#ifndef TP_FS_INT_H
#define TP_FS_INT_H

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
#include "tp_file.h"

#define TIMEOUT (365.0 * 24 * 3600) /* entry and attribute cache lifetime, seconds */
#define RUN_CAP 4096                /* runs mapped per pass */
#define IOV_CAP 1000                /* segments in one iovec reply (below IOV_MAX) */
#define STATS_NAME ".tpfs-stats"
#define RA_NOTE 256                 /* bytes of the shared readahead note */
#define PF_AHEAD (8u << 20)         /* rank-file bytes whose source pages are asked for past a read */
#define PF_UNIT 4096                /* granularity of the prefetch window */
#define REPLIED_UNIT (64u << 10)    /* bytes one bit of fs->replied covers (fs_push.c) */
#define PF_SPAN (4u << 20)          /* most source bytes one residency check (mincore) covers */
#define WN_CHUNK (128u << 10)       /* most bytes asked for by one MADV_WILLNEED */
#define RC_CHUNK (1u << 20)         /* source bytes one residency mark covers (a power of two) */
#define RC_FRESH_MS 1000u           /* a chunk seen whole in the page cache this recently is not checked again */

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
	_Atomic(uint8_t *) *hdr; /* [i * T + r]: local header bytes, made on first use */
	nstate *ns;            /* [i]: per node */
	int inval[2];          /* node numbers to invalidate (| INVAL_ATTR: attributes only) */
	_Atomic int inval_lost;/* the pipe was full: invalidate every changed node */
	pthread_t invalidator;
	_Atomic uint64_t *win; /* [i * T + r]: prefetch window, rank-file units of PF_UNIT: lo << 32 | hi */
	rank_stats *rs;        /* [r] */
	_Atomic int64_t io_base; /* read_bytes of /proc/self/io when serving began (INIT), -1: unknown */
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
	char oom_note[256];    /* the daemon's oom_score_adj and whether it was lowered (fs_session.c) */
	char nice_note[256];   /* the request threads' nice value and whether it was set (fs_session.c) */
	/* --view: the engine's part files at the top (fs_names.c), read by read_file (fs_read.c) */
	size_t vnp;            /* parts per rank; 0: the hf view (rank folders) */
	fuse_ino_t vpart_ino;  /* rank 0's part 0; rank r's part p is vpart_ino + r * vnp + p */
	_Atomic(uint8_t *) *vloc; /* [r * vnp + p]: its local bytes (header, constants), made on first use */
	tp_src **vtab;         /* [p]: the sources part p reads (the same for every rank) */
	_Atomic uint64_t *vwin;/* [r * vnp + p]: prefetch window, as win */
	/* --push: the page cache of the served files filled ahead of the loader (fs_push.c) */
	uint64_t push_budget;  /* bytes the push may store; 0: no push (--push off) */
	_Atomic uint64_t pushed; /* bytes stored so far (only the push thread adds) */
	_Atomic int reads_now; /* reads in flight (counted only while push_budget is set) */
	_Atomic uint32_t *looked; /* [ino]: lookups of it answered (push on), else NULL */
	size_t nlooked;        /* inodes looked covers */
	_Atomic int push_stop; /* set at unmount: the push thread ends */
	_Atomic int push_done; /* set by the push thread as it ends */
	_Atomic uint64_t push_total; /* bytes of the files to push (set once the push has listed them) */
	_Atomic uint64_t push_direct; /* source bytes the push read with O_DIRECT (--push-io direct) */
	_Atomic uint64_t push_skipped; /* bytes the push did not store: reads had replied them first */
	_Atomic uint64_t **replied;   /* [ino] (nlooked): a bit per REPLIED_UNIT bytes of a file to push that a
	                               * read replied whole (fs_read.c's note_replied), else NULL; made before the loop */
	_Atomic int push_reading;     /* the push reads cold source pages with O_DIRECT and has files left:
	                               * reads fetch no source pages past their own (fetch_ahead) */
	_Atomic int push_term; /* a signal asked the loop to end (on_term in fs_push.c) */
	pthread_t loop_thread; /* the thread that runs the FUSE loop (on_term ends it) */
	pthread_t pusher;
	int pushing;           /* the push thread runs (and must be joined) */
	struct pass_tab *pass; /* --passthrough: the copies (fs_pass.c), or NULL */
} tp_fs;

#define PASS_FH 1 /* the fh of an open served from a copy (no handle is ever at address 1) */

/* Per node: what reads and the watcher share. */
typedef struct nstate {
	_Atomic int bad;              /* the source changed: reads fail with EIO */
	_Atomic int pend;             /* an invalidation of its pages is queued */
	_Atomic uint64_t ctime;       /* the source's ctime (ns) last accepted */
	_Atomic uint32_t mode, uid, gid; /* of the source, served */
	_Atomic uint32_t *resid;      /* per RC_CHUNK of source (exact reads): when (ms, 0 = never) a
	                               * residency check last found every page of it cached, or a
	                               * prefetch last asked for every missing page of it */
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

/* Per-thread scratch, made on a thread's first read and freed when it exits. */
typedef struct scratch {
	tp_run runs[RUN_CAP];
	struct iovec iov[IOV_CAP];
	uint8_t *buf;
	size_t cap;
} scratch;


/* ---- fs_log.c ---- */
extern char first_error[512]; /* the first error logged, for the parent in background mode */
extern int daemon_fd;         /* background mode: the socket to the waiting parent, or -1 */
extern FILE *log_file;        /* --log, once daemonized */
/* libfuse's messages, through tp_log. */
void log_fuse(enum fuse_log_level level, const char *fmt, va_list ap);
/* Sends msg (a report to the waiting parent: "O" ready, "D..." failed with the reason). */
void send_note(int fd, const char *msg);
/* Once daemonized: standard streams to /dev/null, messages to log_path (or syslog). */
void detach_stdio(const char *log_path);
/* Where messages go now: the log file's path, syslog, or stderr (before detaching, or -f). */
const char *log_where(void);
/* A read of file (a served file's or a source's name, as the log names it) failed; why is a
 * printf format (a sentence without a final period). Kept for the stats file: one entry per file,
 * its latest reason and time, the latest FAIL_KEEP files. Any thread; never waits on I/O. */
#define FAIL_KEEP 16
#define FAIL_TEXT 240 /* bytes kept of a name and of a reason */
void note_failure(const char *file, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The stats file's lines about failed files into b (cap bytes): "failed: none", or the count and
 * a line per kept file, oldest first. Returns the length written (at most cap - 1). */
size_t failures_text(char *b, size_t cap);
/* The most bytes failures_text writes. */
size_t failures_text_max(void);

/* ---- fs_names.c ---- */
/* The operations table's two halves (fs_session.c assembles them): fs_names.c's, fs_read.c's. */
void names_ops(struct fuse_lowlevel_ops *o);
void read_ops(struct fuse_lowlevel_ops *o);
/* Rank r's inode of node i; and back: 0 with *r and *i set, or -1 for an inode of no node. */
fuse_ino_t ino_of(const tp_fs *fs, uint32_t r, uint32_t i);
int decode(const tp_fs *fs, fuse_ino_t ino, uint32_t *r, uint32_t *i);
/* --view: 0 with rank *r's part *p when ino is a part file that is served, else -1. */
int vdecode(const tp_fs *fs, fuse_ino_t ino, uint32_t *r, size_t *p);
/* The stats file's text (the caller frees it), padded to the size stat gives. */
char *stats_text(tp_fs *fs, size_t *len);

/* ---- fs_read.c ---- */
void fh_free(fhandle *h);

/* A served tensor file as the read path and the residency policy see it (fs_read.c makes it on the
 * stack for each request: rfile_tensors, rfile_part). */
typedef struct rfile {
	tp_file f;
	uint32_t rank, nsrc;
	const tp_src *tab;       /* [nsrc] */
	const uint32_t *node;    /* [nsrc]: the node each source is */
	_Atomic(uint8_t *) *loc; /* its local bytes (header, constants), made on first use */
	_Atomic uint64_t *win;   /* its prefetch window */
	const char *path;        /* a rank folder's file: the source's path; a part file: NULL */
	size_t part;             /* a part file: its number */
	const tp_model *m;       /* a part file: the model (its name) */
	tp_src one;              /* a layout's table */
	uint32_t one_node;
} rfile;

/* ---- fs_resid.c ---- */
/* MADV_RANDOM on every source mapping (exact source reads), or nothing (--source-io readahead). */
void advise_sources(const tp_fs *fs);
/* Before a reply of file bytes [off, off + want) of rf (its first pass of runs is runs[0..nr), covering
 * cov bytes): asks for their source pages unless an earlier read of this window did, and for the next
 * PF_AHEAD bytes' that no read has asked for yet (--source-io exact only). Advisory: changes no byte. */
void fetch_ahead(const tp_fs *fs, const rfile *rf, uint64_t off, uint64_t want, const tp_run *runs, size_t nr,
		 uint64_t cov);
/* After a reply's copy of runs[0..nr): the pages of every source those runs touched leave this
 * process's page table (--release-pages). */
void release_after(tp_fs *fs, const rfile *rf, const tp_run *runs, size_t nr);

/* The push thread's direct source reads (--push-io direct): the runs of a pass whose source pages are
 * not all in the page cache are read with O_DIRECT into buf (no source page cache made, no prefetch,
 * no fault) and gathered from there. Owned by the push thread (fs_push.c makes and frees it). */
typedef struct stage_rg {
	uint64_t lo, hi;  /* page-aligned source span (hi may pass the source's end: a short last read) */
	uint64_t pos;     /* where it lies in buf */
	uint64_t need;    /* the bytes from lo that the runs read (a shorter read: the source changed) */
	uint64_t skip;    /* bytes from lo already in buf (the previous pass's last page) */
	uint64_t got;     /* bytes from lo in buf once read (skip included) */
	uint32_t src;     /* the file's source index */
	int direct;       /* read into buf (else its runs stay on the mapping) */
} stage_rg;

typedef struct push_stage {
	uint8_t *buf;      /* page-aligned, cap bytes */
	size_t cap;
	int *dfd;          /* [nn]: an O_DIRECT descriptor of the node's source; -1 not opened yet,
	                    * -2 none (refused, or O_DIRECT reads fail there: the mapping is used) */
	stage_rg *rg;      /* [RUN_CAP] */
	uint32_t *of;      /* [RUN_CAP]: each run's range, or UINT32_MAX for one that reads no source */
	unsigned char *vec;/* mincore's answer, STAGE_SPAN / page entries */
	tp_src *tab;       /* the file's table and the buffer as its last source */
	uint32_t tabcap;
	unsigned long aio; /* a Linux AIO context (aio_context_t), or 0: reads one at a time */
	uint32_t nn;       /* nodes dfd covers */
	uint8_t *tail;     /* the last page the previous pass read (a run crossing a chunk's end reads it
	                    * again): of node tail_node at tail_off, when tail_ok */
	uint32_t tail_node;
	uint64_t tail_off;
	int tail_ok;
} push_stage;
#define STAGE_MAX (64u << 20)  /* most bytes staged for one pass (beyond: that pass maps) */
#define STAGE_SPAN (64u << 20) /* most source bytes one residency check covers */
#define STAGE_QD 64            /* direct reads in flight */

/* Makes ps (nothing allocated until first used): 0, or -1 out of memory. */
int stage_init(push_stage *ps, uint32_t nn);
void stage_free(push_stage *ps);
/* For the push (--push-io direct): the source pages of runs[0..nr) of rf, coalesced per source into
 * page ranges, that are not all in the page cache are read with O_DIRECT into ps->buf, and the runs in
 * them rewritten to read from there: source index rf->nsrc of *tab (rf's table and the buffer), whose
 * *ntab entries the gather takes. Runs of resident ranges stay on the mapping (nothing is changed
 * where a source cannot be read so). The caller checks the sources before and after, as for any copy.
 * Returns 0, EIO (a source read failed: logged as a failed read), or ESTALE (a source ended before
 * the bytes the runs read: the caller treats it as a changed source). *direct: bytes read. */
int stage_cold(tp_fs *fs, push_stage *ps, const rfile *rf, tp_run *runs, size_t nr, const tp_src **tab, uint32_t *ntab,
	       uint64_t *direct);

/* Whether rank r's folder is served (--ranks). */
int served(const tp_fs *fs, uint32_t r);
/* This thread's scratch with a buffer of at least need bytes, or NULL (out of memory). */
scratch *get_scratch(size_t need);
void scratch_key_make(void);

/* The push's bytes of served file ino (a rank folder's tensor file or a view's part file):
 * [off, off + want) made exactly as a read makes them (every source checked before and after the
 * copy, a changed one marked), into this thread's scratch (*out); with ps (--push-io direct) the
 * source pages not in the page cache are read with O_DIRECT (stage_cold) instead of prefetched and
 * copied from the mapping. want at most the scratch's
 * 1 MiB; *touched: the source bytes it copied. 0, or the errno a read would fail with (ENOENT: not
 * such a file). */
int push_bytes(tp_fs *fs, push_stage *ps, fuse_ino_t ino, uint64_t off, uint64_t want, const uint8_t **out,
	       uint64_t *touched);
/* After storing push_bytes's bytes of ino: as after a reply (a change seen meanwhile drops them);
 * touched (the source bytes of a store the kernel took, else 0) counts in the rank's source_bytes. */
void push_stored(tp_fs *fs, fuse_ino_t ino, uint64_t touched);
/* File ino is whole in the page cache (pushed): a read that still reaches the daemon (a page the
 * kernel dropped or never took) fetches no source page ahead of it, only those it faults on; a
 * page-touch read's prefetch window would fetch up to PF_AHEAD bytes of pages already served. */
void push_whole(tp_fs *fs, fuse_ino_t ino);
/* Before storing bytes of ino made earlier (a copy's, moving into the page cache): every source it
 * reads checked as a read's are. 0, or the errno a read would fail with. */
int push_check(tp_fs *fs, fuse_ino_t ino);

/* ---- fs_push.c ---- */
/* Starts the push thread when fs->push_budget is set (a failure to start is logged: no push), from
 * the thread that then runs the FUSE loop, after libfuse's signal handlers are installed: SIGTERM,
 * SIGINT and SIGHUP then stop the push before they end the loop (fs_push.c says why). */
void start_push(tp_fs *fs);
/* Tells the push thread to end and joins it, once the loop has ended. Nothing when none runs. */
void stop_push(tp_fs *fs);
/* Frees what start_push made for the read path (fs->replied), once no request runs. */
void push_free(tp_fs *fs);

/* ---- fs_mem.c ---- */
/* The budget --push asks for: o->push bytes, or with o->push < 0 a quarter of MemAvailable, never
 * more than MemAvailable; where this process's memory cgroup (or one above it) has a lower limit,
 * that limit stands for MemAvailable (0 where neither can be read and no size was given). */
uint64_t push_budget_of(const tp_fs_opts *o);
/* 1 when memory is short: MemAvailable, or where this process's memory cgroup (or one above) has the
 * tighter limit that limit less its charged memory (page cache included), below an eighth of MemTotal
 * or of that limit. */
int push_memory_short(void);

/* ---- fs_pass.c ---- */
/* --passthrough (with a push budget): makes the private tmpfs and installs the custom I/O that asks
 * the kernel for passthrough, after the mount and before the loop; a failure is logged and leaves
 * files served as without it. */
void pass_setup(tp_fs *fs);
/* The files that may get a copy: ino[k] of size[k] bytes, k < n (the push's list). 0, or -1 out of
 * memory. Before the loop starts. */
int pass_table(tp_fs *fs, const fuse_ino_t *ino, const uint64_t *size, size_t n);
/* Whether copies may be made (set up, kernel not known to refuse). */
int pass_on(const tp_fs *fs);
/* The push thread: 1 when file ino gets a copy (a tmpfs file of its size made, its memory counted
 * in fs->pushed; whole huge pages, within the budget), else 0 (push it into the page cache). */
int pass_claim(tp_fs *fs, fuse_ino_t ino);
/* The push thread: len bytes of ino's copy at off. 0, or an errno. */
int pass_fill(tp_fs *fs, fuse_ino_t ino, uint64_t off, const uint8_t *buf, uint64_t len);
/* The push thread: ino's copy is whole (whole = 1: opens may now be served from it), or abandoned. */
void pass_end_file(tp_fs *fs, fuse_ino_t ino, int whole);
/* An open of served file ino: 1 when it was answered from the copy (fh PASS_FH), 0 when the caller
 * answers it as usual (counted as an open through the daemon). Call only where the open succeeds. */
int pass_open(tp_fs *fs, fuse_req_t req, fuse_ino_t ino);
/* The release of an open of ino (fh: its fh). The last release of opens served from a copy starts
 * its grace period (pass_expire). */
void pass_release(tp_fs *fs, fuse_ino_t ino, uint64_t fh);
/* The push thread, now and then (at most once a second): the copies kept long enough after their
 * last passthrough open was released (--passthrough-keep), or with memory short (push_memory_short)
 * at least the grace period, stop serving opens and are to move into the page cache (pass_gen,
 * pass_move). */
void pass_expire(tp_fs *fs);
/* A source of ino changed: its copy, if any, is emptied and dropped; no open is served from a copy
 * of it again. The invalidation thread. */
void pass_revoke(tp_fs *fs, fuse_ino_t ino);
/* Bumped whenever a copy is to move into the page cache. */
uint32_t pass_gen(const tp_fs *fs);
/* The push thread: a descriptor of ino's copy (its own, to close) when the copy is to move into the
 * page cache now (once), else -1. A source change meanwhile empties the copy (reads of it short). */
int pass_move(tp_fs *fs, fuse_ino_t ino);
/* The push thread: ino's copy has moved into the page cache, or the move was abandoned: it goes. */
void pass_moved(tp_fs *fs, fuse_ino_t ino);
/* The stats file's passthrough line into b (cap bytes). */
size_t pass_text(tp_fs *fs, char *b, size_t cap);
/* Closes every copy and the tmpfs, after the loop and the push have ended. */
void pass_free(tp_fs *fs);

/* ---- fs_watch.c ---- */
/* Starts a thread with every signal blocked (SIGTERM and SIGINT reach the loop's thread). */
int start_thread(pthread_t *t, void *(*fn)(void *), void *arg);
uint64_t ts_ns(struct timespec t);
/* Marks node i's source as changed, for good (why is logged once), and queues the invalidation
 * of its rank files' cached pages. */
void mark_bad(tp_fs *fs, uint32_t i, const char *why);
/* Opens a resolved source path without following any link (ELOOP when one is met). */
int open_real(const char *real, int flags);
/* Whether err is a passing shortage of the daemon's (EMFILE, ENFILE, ENOMEM, EINTR, EAGAIN). */
int transient(int err);
/* Logs (rate-limited) that node i's source could not be checked, and what follows. */
void log_unchecked(const tp_fs *fs, uint32_t i, const char *why, const char *what);
/* 0 when node i may be served (fd: its open source, or -1), else the errno to fail with. */
int source_check(tp_fs *fs, uint32_t i, int fd);
/* After a reply: pages cached by a reply that raced a change are dropped again. */
void after_reply(tp_fs *fs, uint32_t i);
int start_inval(tp_fs *fs);
void stop_inval(tp_fs *fs);
void start_watching(tp_fs *fs);
void stop_watching(tp_fs *fs);

#endif
