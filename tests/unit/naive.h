/* naive.h: the naive reference that test_map.c (layouts) and test_served.c (served files) check against.
 *
 * A test case is one tensor: its name, dtype, shape and the spec it is cut by. naive_tensor computes a rank's
 * local tensor from the distribution rules written here again (naive.c), independently of spec.c and
 * layout.c: for each local element, the source element it comes from, bit by bit. make_file writes cases
 * into an in-memory safetensors file with random data (from rnd, a fixed-seed xorshift: every run draws
 * the same bytes). */
#ifndef TPFS_TEST_NAIVE_H
#define TPFS_TEST_NAIVE_H

#include <stddef.h>
#include <stdint.h>

#include "st_format.h"
#include "spec.h"

/* One tensor of a test: its name, dtype, shape (ndim of 4 used) and the spec it is cut by. */
typedef struct tcase {
	const char *name;
	st_dtype dtype;
	uint32_t ndim;
	uint64_t shape[4];
	tp_spec spec;
} tcase;

/* A source file in memory: its bytes (malloc'd) and its parsed header. */
typedef struct file {
	uint8_t *bytes;
	uint64_t size;
	st_header h;
} file;

/* The next number of the fixed-seed generator (shared by every test of one program). */
uint64_t rnd(void);
/* Sets the generator's state (not 0): test_served.c starts where test_map.c's tests left it when the two were
 * one program, so that both walk the draws they walked then. */
void rnd_seed(uint64_t state);
/* Rank r of T's local tensor of c cut from the source bytes src: its shape (lshape, room for 4 dims) and
 * its bytes (*out, calloc'd, *out_len bytes; trailing bits not covered are zero). -1 when the rules say
 * the cut cannot be served (nothing allocated). */
int naive_tensor(const tcase *c, const uint8_t *src, uint32_t T, uint32_t r, uint64_t *lshape, uint8_t **out,
		 uint64_t *out_len);
/* The bytes of c's tensor in the source. */
uint64_t tensor_bytes(const tcase *c);
/* When set, make_file writes no __metadata__ (test_header_size). */
extern int src_no_meta;
/* Writes the n cases, in the given order, with random data, into f (f->bytes malloc'd) and parses its header
 * into f->h; fails the test if the header is refused. */
void make_file(const tcase *cs, size_t n, file *f);
/* The case of cs named name, or NULL. */
const tcase *case_of(const tcase *cs, size_t n, const char *name);
/* A split spec on axis of units x unit with flags (TP_UNEVEN, TP_GROUPS, ...). */
tp_spec split(uint32_t axis, uint64_t units, uint64_t unit, uint32_t flags);
/* The fixed cases (static storage; *n of them): every kind of cut the rules know, scalar, empty, 3-D,
 * sub-byte and block-scaled tensors. */
tcase *all_cases(size_t *n);

#endif
