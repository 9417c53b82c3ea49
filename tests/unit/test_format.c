/* test_format.c: every rule of the safetensors validator (one valid and one invalid case at
 * least), the prefix checks of st_read_fd, and the header writer (round trip, padding,
 * alignment, escaping, determinism). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "st_format.h"

/* Parses header json with a data buffer of data_len bytes; returns rc, message in e. */
static int parse(const char *json, uint64_t data_len, st_header *h, tp_err *e)
{
	size_t n = strlen(json);
	tp_err_clear(e);
	return st_parse_header(json, n, 8 + n + data_len, "f.safetensors", h, e);
}

/* Expects json (with data_len data bytes) to be refused with a message containing want. */
static void refused(const char *json, uint64_t data_len, const char *want)
{
	st_header h;
	tp_err e;
	int rc = parse(json, data_len, &h, &e);
	if (rc == 0 || !strstr(e.msg, want))
		fail_msg("header %s: rc %d, message '%s', wanted '%s'", json, rc, e.msg, want);
	assert_true(strncmp(e.msg, "f.safetensors: ", 15) == 0);
}

static void accepted(const char *json, uint64_t data_len)
{
	st_header h;
	tp_err e;
	if (parse(json, data_len, &h, &e) != 0)
		fail_msg("header %s refused: %s", json, e.msg);
	st_header_free(&h);
}

static void test_minimal(void **state)
{
	(void)state;
	accepted("{}", 0);
	accepted("{}      ", 0);
	accepted("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8);
	st_header h;
	tp_err e;
	assert_int_equal(parse("{\"b\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[8,20]},"
			       "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
			       "\"__metadata__\":{\"format\":\"pt\"}}",
			       20, &h, &e),
			 0);
	assert_int_equal(h.n, 2);
	assert_string_equal(h.t[0].name, "a"); /* sorted by offset */
	assert_string_equal(h.t[1].name, "b");
	assert_int_equal(h.t[1].dtype, ST_BF16);
	assert_int_equal(h.t[1].ndim, 2);
	assert_int_equal(h.t[1].shape[1], 3);
	assert_int_equal(h.nmeta, 1);
	assert_string_equal(h.meta[0].value, "pt");
	assert_non_null(st_find(&h, "b"));
	assert_null(st_find(&h, "c"));
	st_header_free(&h);
}

static void test_start_and_json(void **state)
{
	(void)state;
	refused(" {}", 0, "does not start with '{'");
	refused("[]", 0, "does not start with '{'");
	refused("{\"a\":", 0, "not valid JSON");
	refused("{} x", 0, "other than whitespace");
	refused("{}\n\t ", 0 + 1, "trailing bytes");
	accepted("{}\n\t ", 0);
	refused("{\"\xff\":1}", 0, "invalid UTF-8");
	refused("{\"a\xc0\x80\":1}", 0, "invalid UTF-8"); /* overlong NUL */
	accepted("{\"\xc3\xa9\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1);
	refused("{\"a\x01\":{}}", 0, "raw control character");
	refused("{\"a\\u0000b\":{}}", 0, "escaped NUL");
}

static void test_dtypes(void **state)
{
	(void)state;
	for (int d = 0; d < ST_NDTYPES; d++) {
		unsigned bits = st_dtype_bits((st_dtype)d);
		/* 8 elements of any dtype are a whole number of bytes */
		char json[256];
		snprintf(json, sizeof json, "{\"t\":{\"dtype\":\"%s\",\"shape\":[8],\"data_offsets\":[0,%u]}}",
			 st_dtype_name((st_dtype)d), bits);
		st_header h;
		tp_err e;
		assert_int_equal(parse(json, bits, &h, &e), 0);
		assert_int_equal(h.t[0].dtype, d);
		st_dtype back;
		assert_int_equal(st_dtype_parse(st_dtype_name((st_dtype)d), strlen(st_dtype_name((st_dtype)d)), &back), 0);
		assert_int_equal(back, d);
		st_header_free(&h);
	}
	refused("{\"t\":{\"dtype\":\"F12\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, "unknown dtype 'F12'");
	refused("{\"t\":{\"dtype\":3,\"shape\":[1],\"data_offsets\":[0,1]}}", 1, "unknown dtype");
	refused("{\"t\":{\"dtype\":\"bf16\",\"shape\":[1],\"data_offsets\":[0,2]}}", 2, "unknown dtype");
}

static void test_entry_fields(void **state)
{
	(void)state;
	refused("{\"t\":[1]}", 0, "tensor 't': entry is not an object");
	refused("{\"t\":{\"shape\":[1],\"data_offsets\":[0,1]}}", 1, "missing field 'dtype'");
	refused("{\"t\":{\"dtype\":\"U8\",\"data_offsets\":[0,1]}}", 1, "missing field 'shape'");
	refused("{\"t\":{\"dtype\":\"U8\",\"shape\":[1]}}", 1, "missing field 'data_offsets'");
	refused("{\"t\":{\"dtype\":\"U8\",\"shape\":1,\"data_offsets\":[0,1]}}", 1, "shape is not an array");
	refused("{\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0]}}", 1, "not an array of two");
	refused("{\"t\":{\"dtype\":\"U8\",\"shape\":[\"1\"],\"data_offsets\":[0,1]}}", 1, "shape[0] is not");
	accepted("{\"t\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 1);
	refused("{\"t\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 1, "tpfs limit of 8");
}

static void test_numbers(void **state)
{
	(void)state;
	refused("{\"t\":{\"dtype\":\"U8\",\"shape\":[-1],\"data_offsets\":[0,1]}}", 1, "negative number");
	refused("{\"t\":{\"dtype\":\"U8\",\"shape\":[1.5],\"data_offsets\":[0,1]}}", 1, "fractional number");
	refused("{\"t\":{\"dtype\":\"U8\",\"shape\":[1.0],\"data_offsets\":[0,1]}}", 1, "fractional number");
	refused("{\"t\":{\"dtype\":\"U8\",\"shape\":[1e0],\"data_offsets\":[0,1]}}", 1, "exponent form");
	refused("{\"t\":{\"dtype\":\"U8\",\"shape\":[18446744073709551617],\"data_offsets\":[0,1]}}", 1, "below 2^53");
	refused("{\"t\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296,4294967296],\"data_offsets\":[0,1]}}", 1,
		"element count overflows");
	refused("{\"t\":{\"dtype\":\"U64\",\"shape\":[4294967296,1073741824],\"data_offsets\":[0,1]}}", 1,
		"bit count overflows");
	/* huge shapes that do not overflow are refused by the byte count, never allocated */
	refused("{\"t\":{\"dtype\":\"U8\",\"shape\":[1152921504606846],\"data_offsets\":[0,1]}}", 1,
		"need 1152921504606846");
}

static void test_offsets(void **state)
{
	(void)state;
	refused("{\"t\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[10,8]}}", 0,
		"tensor 't': data_offsets [10, 8] end before begin");
	refused("{\"t\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,3]}}", 3, "hold 3 bytes but");
	refused("{\"t\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[1,3]}}", 3, "leave a hole");
	refused("{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},"
		"\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[3,5]}}", 5, "tensor 'b'");
	refused("{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},"
		"\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[1,3]}}", 3, "overlap the previous");
	accepted("{\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[2,4]},"
		 "\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}", 4);
	refused("{\"t\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}", 3, "trailing bytes");
	refused("{\"t\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}", 1, "truncated");
}

static void test_subbyte_scalar_empty(void **state)
{
	(void)state;
	accepted("{\"t\":{\"dtype\":\"F4\",\"shape\":[3,2],\"data_offsets\":[0,3]}}", 3);
	refused("{\"t\":{\"dtype\":\"F4\",\"shape\":[3],\"data_offsets\":[0,2]}}", 2, "not a whole number of bytes");
	accepted("{\"t\":{\"dtype\":\"F6_E2M3\",\"shape\":[4],\"data_offsets\":[0,3]}}", 3);
	refused("{\"t\":{\"dtype\":\"F6_E3M2\",\"shape\":[2],\"data_offsets\":[0,2]}}", 2, "not a whole number");
	accepted("{\"s\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}}", 4);
	refused("{\"s\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,0]}}", 0, "need 4");
	accepted("{\"e\":{\"dtype\":\"F32\",\"shape\":[0,5],\"data_offsets\":[0,0]},"
		 "\"f\":{\"dtype\":\"F32\",\"shape\":[5,0],\"data_offsets\":[0,0]},"
		 "\"g\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4);
	refused("{\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,4]}}", 4, "need 0");
}

static void test_duplicates_and_metadata(void **state)
{
	(void)state;
	refused("{\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
		"\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}", 2, "tensor 't': duplicate key");
	refused("{\"__metadata__\":{},\"__metadata__\":{}}", 0, "duplicate key");
	accepted("{\"__metadata__\":{\"a\":\"1\",\"b\":\"x\"}}", 0);
	refused("{\"__metadata__\":{\"a\":1}}", 0, "value of 'a' is not a string");
	refused("{\"__metadata__\":[\"a\"]}", 0, "__metadata__ is not an object");
	refused("{\"__metadata__\":{\"a\":\"1\",\"a\":\"2\"}}", 0, "duplicate key 'a'");
}

/* st_read_fd on a memfd holding bytes. */
static int read_bytes(const void *bytes, size_t n, st_header *h, tp_err *e)
{
	int fd = memfd_create("st", 0);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, bytes, n), (ssize_t)n);
	int rc = st_read_fd(fd, n, "f.safetensors", h, e);
	close(fd);
	return rc;
}

static void test_prefix(void **state)
{
	(void)state;
	st_header h;
	tp_err e;
	assert_int_equal(read_bytes("\x02\0\0\0\0\0\0", 7, &h, &e), -1);
	assert_non_null(strstr(e.msg, "shorter than the 8-byte header length"));
	assert_int_equal(read_bytes("\x00\xe2\xf5\x05\0\0\0\0{}", 10, &h, &e), -1); /* 100,000,256 */
	assert_non_null(strstr(e.msg, "exceeds the limit of 100000000"));
	assert_int_equal(read_bytes("\x10\0\0\0\0\0\0\0{}", 10, &h, &e), -1);
	assert_non_null(strstr(e.msg, "runs past the end"));
	assert_int_equal(read_bytes("\x02\0\0\0\0\0\0\0{}", 10, &h, &e), 0);
	st_header_free(&h);
	const char *json = "{\"t\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]}}  ";
	char img[128] = {0};
	size_t jl = strlen(json);
	img[0] = (char)jl;
	memcpy(img + 8, json, jl);
	memcpy(img + 8 + jl, "abc", 3);
	assert_int_equal(read_bytes(img, 8 + jl + 3, &h, &e), 0);
	assert_int_equal(h.data_start, 8 + jl);
	assert_int_equal(h.data_len, 3);
	st_header_free(&h);
}

static void test_writer(void **state)
{
	(void)state;
	/* three tensors of mixed sizes in writer order, with awkward names */
	const char *names[] = {"w\"q\\uote", "b\xc3\xa9", "c\n"};
	st_dtype dt[] = {ST_F64, ST_BF16, ST_U8};
	uint64_t shapes[][2] = {{3, 1}, {5, 1}, {7, 1}};
	uint64_t sizes[] = {24, 10, 7};
	st_meta meta[] = {{"format", "pt"}};
	char buf[1024];
	for (int pass = 0; pass < 2; pass++) {
		st_wbuf w = {.p = pass ? buf : NULL};
		st_w_begin(&w, meta, 1);
		uint64_t off = 0;
		for (int i = 0; i < 3; i++) {
			st_w_tensor(&w, names[i], dt[i], 2, shapes[i], off, off + sizes[i]);
			off += sizes[i];
		}
		uint64_t total = st_w_end(&w);
		assert_int_equal(total % 8, 0);
		if (pass == 1) {
			uint64_t n = 0;
			for (int i = 7; i >= 0; i--)
				n = (n << 8) | (unsigned char)buf[i];
			assert_int_equal(n + 8, total);
			st_header h;
			tp_err e;
			assert_int_equal(st_parse_header(buf + 8, n, total + off, "w", &h, &e), 0);
			assert_int_equal(h.n, 3);
			for (int i = 0; i < 3; i++) {
				assert_string_equal(h.t[i].name, names[i]);
				/* natural alignment of each tensor in the file */
				assert_int_equal((h.data_start + h.t[i].begin) % (st_dtype_bits(dt[i]) / 8), 0);
			}
			assert_string_equal(h.meta[0].key, "format");
			st_header_free(&h);
		}
	}
	assert_true(st_writer_cmp(ST_F32, "z", ST_BF16, "a") < 0);
	assert_true(st_writer_cmp(ST_BF16, "a", ST_BF16, "b") < 0);
	assert_true(st_writer_cmp(ST_U8, "a", ST_F4, "a") < 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_minimal),
		cmocka_unit_test(test_start_and_json),
		cmocka_unit_test(test_dtypes),
		cmocka_unit_test(test_entry_fields),
		cmocka_unit_test(test_numbers),
		cmocka_unit_test(test_offsets),
		cmocka_unit_test(test_subbyte_scalar_empty),
		cmocka_unit_test(test_duplicates_and_metadata),
		cmocka_unit_test(test_prefix),
		cmocka_unit_test(test_writer),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
