/* test_guard.c: a copy from a mapping of a file truncated under it fails cleanly (TP_ECHANGED)
 * instead of killing the process with SIGBUS, and the guard leaves later copies working; a
 * backend that holds a lock while it copies source bytes (as the CUDA module does) gets the
 * failure back as an error and releases its lock: the next gather does not wait for ever. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "guard.h"

static void test_truncated_mapping(void **state)
{
	(void)state;
	tp_guard_install();
	int fd = memfd_create("src", 0);
	assert_true(fd >= 0);
	size_t len = 1 << 16;
	uint8_t *fill = malloc(len);
	for (size_t i = 0; i < len; i++)
		fill[i] = (uint8_t)i;
	assert_int_equal(write(fd, fill, len), (ssize_t)len);
	const uint8_t *map = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
	assert_true(map != MAP_FAILED);
	tp_src src = {.fd = fd, .map = map, .size = len};
	tp_run run = {.off = 8192, .len = 4096, .kind = TP_RUN_SRC};
	uint8_t out[4096];
	tp_err e;
	assert_int_equal(tp_guarded_gather(&tp_gather_cpu_backend, &run, 1, &src, NULL, out, &e), 0);
	assert_memory_equal(out, fill + 8192, 4096);
	assert_int_equal(ftruncate(fd, 0), 0); /* the file shrinks under the mapping */
	for (int k = 0; k < 3; k++) {
		tp_err_clear(&e);
		assert_int_equal(tp_guarded_gather(&tp_gather_cpu_backend, &run, 1, &src, NULL, out, &e), -1);
		assert_int_equal(e.code, TP_ECHANGED);
		assert_non_null(strstr(e.msg, "SIGBUS"));
	}
	/* the guard is disarmed after each call: a valid copy still works */
	tp_src heap = {.fd = -1, .map = fill, .size = len};
	run.off = 100;
	assert_int_equal(tp_guarded_gather(&tp_gather_cpu_backend, &run, 1, &heap, NULL, out, &e), 0);
	assert_memory_equal(out, fill + 100, 4096);
	munmap((void *)map, len);
	close(fd);
	free(fill);
}

/* A backend shaped like the CUDA module: one lock around the whole gather, source bytes copied
 * through tp_src_copy into a staging buffer in chunks. */
typedef struct locked_backend {
	pthread_mutex_t mu;
	uint8_t stage[1024];
	int calls;
} locked_backend;

static int locked_gather(void *self, const tp_run *runs, size_t n, const tp_src *src, const uint8_t *hdr,
			 uint8_t *dst, tp_err *e)
{
	(void)hdr;
	locked_backend *b = self;
	pthread_mutex_lock(&b->mu);
	b->calls++;
	int rc = 0;
	for (size_t i = 0; i < n && rc == 0; i++) {
		for (uint64_t done = 0; done < runs[i].len && rc == 0;) {
			size_t l = runs[i].len - done < sizeof b->stage ? runs[i].len - done : sizeof b->stage;
			if (tp_src_copy(src, b->stage, runs[i].off + done, l) < 0)
				rc = tp_fail(e, TP_ECHANGED, "source copy failed (SIGBUS caught)");
			else
				memcpy(dst, b->stage, l);
			dst += l;
			done += l;
		}
	}
	pthread_mutex_unlock(&b->mu);
	return rc;
}

static void locked_destroy(void *self)
{
	(void)self;
}

static void test_fault_releases_backend_lock(void **state)
{
	(void)state;
	tp_guard_install();
	static const tp_gather_ops ops = {"locked", locked_gather, locked_destroy};
	locked_backend b = {.calls = 0};
	pthread_mutex_init(&b.mu, NULL);
	tp_gather g = {&ops, &b};
	int fd = memfd_create("src", 0);
	size_t len = 1 << 16;
	assert_int_equal(ftruncate(fd, (off_t)len), 0);
	const uint8_t *map = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
	assert_true(map != MAP_FAILED);
	tp_src src = {.fd = fd, .map = map, .size = len};
	tp_run runs[2] = {{.off = 0, .len = 4096, .kind = TP_RUN_SRC}, {.off = 32768, .len = 4096, .kind = TP_RUN_SRC}};
	uint8_t out[8192];
	tp_err e;
	assert_int_equal(tp_guarded_gather(&g, runs, 2, &src, NULL, out, &e), 0);
	assert_int_equal(ftruncate(fd, 16384), 0); /* the second run now lies past the end */
	for (int k = 0; k < 3; k++) {
		tp_err_clear(&e);
		assert_int_equal(tp_guarded_gather(&g, runs, 2, &src, NULL, out, &e), -1);
		assert_int_equal(e.code, TP_ECHANGED);
		/* the lock was released on the way out */
		assert_int_equal(pthread_mutex_trylock(&b.mu), 0);
		pthread_mutex_unlock(&b.mu);
	}
	assert_int_equal(b.calls, 4);
	/* a gather within what is left still works */
	assert_int_equal(tp_guarded_gather(&g, runs, 1, &src, NULL, out, &e), 0);
	munmap((void *)map, len);
	close(fd);
	pthread_mutex_destroy(&b.mu);
}

int main(void)
{
	const struct CMUnitTest tests[] = {cmocka_unit_test(test_truncated_mapping),
					   cmocka_unit_test(test_fault_releases_backend_lock)};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
