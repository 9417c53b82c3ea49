/* slurp: reading a small file whole; see slurp.h. */
#include "slurp.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define JSON_FILE_MAX (1 << 30) /* bytes: the tpfs limit for JSON files */

/* What a file of mode m is, for a refusal. */
static const char *kind_of(mode_t m)
{
	return S_ISDIR(m) ? "a folder" : S_ISFIFO(m) ? "a FIFO" : S_ISCHR(m) ? "a character device" :
	       S_ISBLK(m) ? "a block device" : S_ISSOCK(m) ? "a socket" : "not a file";
}

/* tp_fail with errno as it was before the call (for tp_open_regular's callers). */
#define FAIL_KEEP_ERRNO(err, ...) (tp_fail(__VA_ARGS__), errno = (err), -1)

int tp_open_regular(const char *path, const char *name, const char *hint, struct stat *st, tp_err *e)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK), err = errno;
	if (fd < 0)
		return FAIL_KEEP_ERRNO(err, e, TP_EIO, "%s: cannot open: %s", name, strerror(err));
	if (fstat(fd, st) < 0) {
		err = errno;
		close(fd);
		return FAIL_KEEP_ERRNO(err, e, TP_EIO, "%s: cannot stat: %s", name, strerror(err));
	}
	if (!S_ISREG(st->st_mode)) {
		close(fd);
		return tp_fail(e, TP_EINVAL, "%s: not a regular file (%s)%s%s", name, kind_of(st->st_mode), hint ? " " : "",
			       hint ? hint : "");
	}
	int fl = fcntl(fd, F_GETFL);
	if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) < 0) { /* a regular file: reads as usual */
		err = errno;
		close(fd);
		return FAIL_KEEP_ERRNO(err, e, TP_EIO, "%s: cannot clear O_NONBLOCK: %s", name, strerror(err));
	}
	return fd;
}

char *tp_slurp(const char *path, const char *name, const char *hint, size_t *len, tp_err *e)
{
	struct stat st;
	int fd = tp_open_regular(path, name, hint, &st, e);
	if (fd < 0)
		return NULL;
	if (st.st_size > JSON_FILE_MAX) {
		close(fd);
		tp_fail(e, TP_ELIMIT, "%s: larger than 1 GiB, the tpfs limit for JSON files", name);
		return NULL;
	}
	char *buf = malloc((size_t)st.st_size + 1);
	size_t got = 0;
	while (buf && got < (size_t)st.st_size) {
		ssize_t r = read(fd, buf + got, (size_t)st.st_size - got);
		if (r <= 0)
			break;
		got += (size_t)r;
	}
	close(fd);
	if (!buf) {
		tp_fail(e, TP_ENOMEM, "out of memory");
		return NULL;
	}
	if (got != (size_t)st.st_size) {
		free(buf);
		tp_fail(e, TP_EIO, "%s: read %zu of its %lld bytes (it changed while being read)", name, got,
			(long long)st.st_size);
		return NULL;
	}
	buf[got] = 0;
	*len = got;
	return buf;
}
