/* fs_log.c: where the daemon's messages go (the filesystem's logging room).
 *
 * "tpfs: LEVEL: message" on stderr, or, once daemonized, in the --log file or syslog; the first
 * error is kept for the parent that waits in background mode (send_note). Repeated warnings are
 * shown TP_LOG_REPEAT times per kind and then counted (tp_log_shown, tp_log_repeats). Also the
 * open-file limit (tp_fs_nofile), which the CLI checks before mounting.
 */
#include "fs_int.h"

/* ---- logging ---- */

int tp_log_debug;
static int log_syslog;
char first_error[512]; /* the first error logged, for the parent in background mode */
int daemon_fd = -1;     /* background mode: the socket to the waiting parent (see below) */
FILE *log_file;

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
