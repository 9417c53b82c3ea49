/* slurp: reading a small file whole; see slurp.h. */
#include "slurp.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define JSON_FILE_MAX (1 << 30) /* bytes: the tpfs limit for JSON files */

char *tp_slurp(const char *path, const char *name, const char *hint, size_t *len, tp_err *e)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		tp_fail(e, TP_EIO, "%s: cannot open: %s", name, strerror(errno));
		return NULL;
	}
	struct stat st;
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
		close(fd);
		tp_fail(e, TP_EINVAL, "%s: not a regular file%s%s", name, hint ? " " : "", hint ? hint : "");
		return NULL;
	}
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
