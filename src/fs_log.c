/* fs_log.c: where the daemon's messages go (the filesystem's logging room).
 *
 * "tpfs: LEVEL: message" on stderr, or, once daemonized, in the --log file or syslog; the first
 * error is kept for the parent that waits in background mode (send_note). Repeated warnings are
 * shown TP_LOG_REPEAT times per kind and then counted (tp_log_shown, tp_log_repeats). The files
 * whose reads failed are also kept, the latest FAIL_KEEP of them with their reason and time, for
 * the stats file (note_failure, failures_text): a loader that maps a file gets a failed read as a
 * bus error, and the log may be where its user does not look. Also the open-file limit
 * (tp_fs_nofile), which the CLI checks before mounting.
 */
#include "fs_int.h"

/* ---- logging ---- */

int tp_log_debug;
static int log_syslog;
char first_error[512]; /* the first error logged, for the parent in background mode */
int daemon_fd = -1;     /* background mode: the socket to the waiting parent (see below) */
FILE *log_file;
static const char *log_name; /* log_file's path */

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
void log_fuse(enum fuse_log_level level, const char *fmt, va_list ap)
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

const char *log_where(void)
{
	return log_name ? log_name : log_syslog ? "syslog (tag tpfs: journalctl -t tpfs)" : "stderr (tpfs mount -f)";
}

/* ---- failed files ---- */

/* The latest FAIL_KEEP files whose reads failed, oldest first, one entry per file; the lock is held
 * only to copy a few hundred bytes (no handler waits on anything under it). */
static struct {
	char file[FAIL_TEXT];
	char why[FAIL_TEXT];
	struct timespec when; /* the latest failure, CLOCK_REALTIME */
	uint64_t n;           /* failures noted for it */
} fails[FAIL_KEEP];
static uint32_t nfails;
static uint64_t fails_dropped; /* files that left the list for newer ones */
static pthread_mutex_t fail_lock = PTHREAD_MUTEX_INITIALIZER;

void note_failure(const char *file, const char *fmt, ...)
{
	char name[FAIL_TEXT], why[FAIL_TEXT];
	size_t len = strlen(file);
	if (len < sizeof name) /* a long name keeps its end: the file's own name */
		memcpy(name, file, len + 1);
	else
		snprintf(name, sizeof name, "...%s", file + len - (sizeof name - 4));
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(why, sizeof why, fmt, ap);
	va_end(ap);
	struct timespec now;
	clock_gettime(CLOCK_REALTIME, &now);
	pthread_mutex_lock(&fail_lock);
	uint32_t k = 0;
	while (k < nfails && strcmp(fails[k].file, name) != 0)
		k++;
	uint64_t n = k < nfails ? fails[k].n : 0;
	if (k == nfails && nfails == FAIL_KEEP) { /* a new file: the oldest leaves the list */
		k = 0;
		fails_dropped++;
	}
	if (k < nfails) { /* moved to the end, the newest */
		memmove(&fails[k], &fails[k + 1], (nfails - k - 1) * sizeof fails[0]);
		nfails--;
	}
	memcpy(fails[nfails].file, name, sizeof name);
	memcpy(fails[nfails].why, why, sizeof why);
	fails[nfails].when = now;
	fails[nfails].n = n + 1;
	nfails++;
	pthread_mutex_unlock(&fail_lock);
}

size_t failures_text(char *b, size_t cap)
{
	size_t w = 0;
#define PUT(...) (w += w < cap ? (size_t)snprintf(b + w, cap - w, __VA_ARGS__) : 0)
	pthread_mutex_lock(&fail_lock);
	if (!nfails)
		PUT("failed: none\n");
	else
		PUT("failed: %llu file%s (their reads failed: a loader that maps a file gets that as a bus error, SIGBUS)\n",
		    (unsigned long long)(nfails + fails_dropped), nfails + fails_dropped == 1 ? "" : "s");
	for (uint32_t k = 0; k < nfails; k++) {
		struct tm tm;
		char when[32] = "?";
		if (gmtime_r(&fails[k].when.tv_sec, &tm))
			strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
		PUT("  %s %s: %s", when, fails[k].file, fails[k].why);
		if (fails[k].n > 1)
			PUT(" (%llu times; the time is the latest's)", (unsigned long long)fails[k].n);
		PUT("\n");
	}
	if (fails_dropped)
		PUT("  and %llu earlier file%s not listed (the log names every one)\n", (unsigned long long)fails_dropped,
		    fails_dropped == 1 ? "" : "s");
	pthread_mutex_unlock(&fail_lock);
#undef PUT
	return w < cap ? w : cap ? cap - 1 : 0;
}

size_t failures_text_max(void)
{
	return 256 + FAIL_KEEP * (2 * FAIL_TEXT + 96) + 128;
}

void send_note(int fd, const char *msg)
{
	if (fd >= 0 && send(fd, msg, strlen(msg), MSG_NOSIGNAL) < 0 && errno != EPIPE)
		tp_log(0, "could not report to the waiting parent: %s", strerror(errno));
}

/* Background mode, once ready: stdio goes to /dev/null, the log to the --log file or syslog. */
void detach_stdio(const char *log_path)
{
	int nul = open("/dev/null", O_RDWR);
	if (nul < 0)
		return;
	if (log_path) { /* never blocks: a FIFO made after the CLI's check is refused here, not waited on */
		int fd = open(log_path, O_WRONLY | O_APPEND | O_CREAT | O_NONBLOCK | O_CLOEXEC, 0644);
		struct stat st;
		const char *why = fd < 0 ? strerror(errno) : fstat(fd, &st) < 0 ? strerror(errno)
							  : !S_ISREG(st.st_mode) ? "not a regular file" : NULL;
		if (!why && fcntl(fd, F_SETFL, O_APPEND) < 0) /* blocking writes again */
			why = strerror(errno);
		if (!why && !(log_file = fdopen(fd, "a")))
			why = strerror(errno);
		if (why && fd >= 0)
			close(fd);
		log_name = log_file ? log_path : NULL;
		if (!log_file)
			tp_log(0, "cannot open log %s: %s; logging to syslog", log_path, why);
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
