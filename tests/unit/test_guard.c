/* test_guard.c: a copy from a mapping of a file truncated under it fails cleanly (TP_ECHANGED)
 * instead of killing the process with SIGBUS, and the guard leaves later copies working. */
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

int main(void)
{
	const struct CMUnitTest tests[] = {cmocka_unit_test(test_truncated_mapping)};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
