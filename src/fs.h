/* fs.h: the FUSE filesystem over a planned model (the thin shell's lower half).
 *
 * Layout of a mount: MNT/rank{r}/<every path of SRC> for each served r < T (all, or --ranks), and
 * MNT/.tpfs-stats (counters).
 * This is the only layer that speaks errno and libfuse; it reads the model and never changes
 * the plan. Its rooms: fs_names.c (namespace), fs_read.c (the read path), fs_watch.c (changed
 * sources), fs_push.c (push-ahead), fs_session.c (a mount's life), fs_log.c (messages); fs_int.h
 * is what they share.
 */
#ifndef TP_FS_H
#define TP_FS_H

#include "model.h"
#include "tp_err.h"

/* Which gather backend copies the source bytes of fragmented reads. */
typedef enum tp_gather_mode {
	TP_GATHER_AUTO, /* CPU, and CUDA only past cuda_min_runs and cuda_min_bytes when both are set */
	TP_GATHER_CPU,  /* CPU only */
	TP_GATHER_CUDA, /* CUDA for every strided gather; mounting fails without a usable device */
} tp_gather_mode;

typedef struct tp_fs_opts {
	const char *mnt;         /* mountpoint, absolute */
	int foreground;          /* stay attached (else fork; return once the mount answers) */
	int debug;               /* libfuse debug output and counters at unmount */
	const char *fuse_opts;   /* extra -o options, or NULL */
	unsigned readahead_kb;   /* bdi read_ahead_kb to set after mounting; 0 leaves it */
	unsigned threads;        /* max worker threads */
	const char *log_path;    /* background mode: log file (default: syslog) */
	tp_gather_mode gather;
	unsigned cuda_min_runs;  /* auto: use CUDA for gathers of at least this many source runs ... */
	unsigned long long cuda_min_bytes; /* ... and bytes; 0 (the default): never, until measured */
	int reply;               /* 0 auto, 1 always iovec into the mapping, 2 always copy (tuning) */
	unsigned max_background; /* FUSE background requests (readahead in flight); 0: tpfs default */
	int release_pages;       /* drop the daemon's page-table entries of source pages after each
	                          * reply (keeps RSS flat); -1 auto (on), 0 off, 1 on */
	const uint8_t *serve;    /* [T]: 1 for each rank folder served (--ranks), or NULL: all */
	uint32_t nserve;         /* ranks served when serve is set */
	int mnt_lock;            /* -1, or a descriptor of the mount point's folder holding an exclusive
	                          * flock (the CLI's, taken before planning): closed once the mount
	                          * exists or has failed, so a second tpfs waits for neither */
	int source_io;           /* how source pages are fetched: 0 exact (no readahead on the source
	                          * mappings, the next runs prefetched, the default), 1 the kernel's
	                          * readahead, 2 no readahead and no prefetch (for measuring) */
	long long push;          /* --push: bytes of served files stored into the page cache ahead of
	                          * reads; 0 off; -1 (auto, the default) a quarter of MemAvailable at mount */
	int push_io;             /* --push-io: how the push reads source pages that are not in the page
	                          * cache: 0 direct (O_DIRECT into its buffer), 1 map (ask for them with
	                          * MADV_WILLNEED and copy from the mapping, as a read does), -1 auto (the
	                          * default): direct where one rank is served, else map */
	int passthrough;         /* --passthrough on: pushed files served from private copies by FUSE
	                          * passthrough (fs_pass.c); 0 off */
	uint32_t pass_keep;      /* --passthrough-keep: seconds a copy stays after its loader closed it
	                          * (while memory is not short), before it moves into the page cache */
	int nice;                /* --nice: the nice value of the threads that answer FUSE requests (-20..19);
	                          * TP_NICE_KEEP leaves the one the daemon inherits */
} tp_fs_opts;

#define TP_NICE_KEEP 100 /* tp_fs_opts.nice: leave the threads' priority as inherited */
#define TP_NICE_DEFAULT -10

/* Mounts m at o->mnt and serves it until unmounted (fusermount3 -u, tpfs umount, SIGTERM,
 * SIGINT). In background mode the calling process returns as soon as the mount answers
 * (*parent = 1), or with an error when it cannot; the forked child serves and returns when
 * unmounted (*parent = 0). Returns 0 or -1 with e set. */
int tp_fs_main(tp_model *m, const tp_fs_opts *o, int *parent, tp_err *e);

/* Raises the soft limit on open files to the hard limit (a daemon holds one descriptor per
 * safetensors file). With need > 0, fails, naming both limits, when the limit is below need. */
int tp_fs_nofile(uint64_t need, tp_err *e);

/* Repeated warnings: of each kind (messages equal once quoted text and numbers are left out)
 * the first TP_LOG_REPEAT are shown; tp_log_shown says whether msg is one of them (and counts
 * it), tp_log_repeats then logs "... and N more like ..." for each kind that had more. */
#define TP_LOG_REPEAT 5
int tp_log_shown(const char *msg);
void tp_log_repeats(void);

/* Log sink of the filesystem and the CLI: "tpfs: LEVEL: message" on stderr, or in the log file
 * or syslog once daemonized. level: 0 warn, 1 info, 2 error, 3 debug. */
void tp_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void tp_log_model(void *ctx, int level, const char *msg);
extern int tp_log_debug;

#endif
