/* st_format.h: the safetensors file format, its constants and its limits.
 *
 * A safetensors file is an 8-byte little-endian length N, N bytes of UTF-8 JSON (the header),
 * then the data buffer. The header maps tensor names to {dtype, shape, data_offsets} and may
 * hold "__metadata__" (string -> string). This module parses and strictly validates headers
 * (every rule the official parser enforces, see st_parse_header) and writes headers in the
 * official writer's shape (compact JSON, padded with spaces to a multiple of 8). It knows
 * nothing of plans, ranks or FUSE.
 */
#ifndef ST_FORMAT_H
#define ST_FORMAT_H

#include <stdint.h>
#include <stddef.h>

#include "tp_err.h"

/* Limits of the format (enforced by the official parser). */
#define ST_HEADER_MAX 100000000ULL /* N must not exceed this */
#define ST_PREFIX 8                /* bytes of the length prefix */

/* Limits of tpfs (named so that errors can cite them). */
#define ST_MAX_DIMS 8          /* dimensions of one tensor */
#define ST_MAX_TENSORS 1000000 /* tensors in one file */
#define ST_MAX_NAME 4096       /* bytes of one tensor name or metadata key */

typedef enum st_dtype {
	ST_BOOL,
	ST_F4,
	ST_F6_E2M3,
	ST_F6_E3M2,
	ST_U8,
	ST_I8,
	ST_F8_E5M2,
	ST_F8_E4M3,
	ST_F8_E8M0,
	ST_F8_E4M3FNUZ,
	ST_F8_E5M2FNUZ,
	ST_I16,
	ST_U16,
	ST_F16,
	ST_BF16,
	ST_I32,
	ST_U32,
	ST_F32,
	ST_C64,
	ST_F64,
	ST_I64,
	ST_U64,
	ST_NDTYPES
} st_dtype;

/* Name as written in headers ("BF16"), or NULL for an out-of-range value. */
const char *st_dtype_name(st_dtype d);
/* Bits per element (4 for F4, 6 for F6_*, 16 for BF16, ...). */
unsigned st_dtype_bits(st_dtype d);
/* Parses a dtype name of length len; returns 0 and sets *out, or -1 if unknown. */
int st_dtype_parse(const char *s, size_t len, st_dtype *out);

typedef struct st_tensor {
	const char *name;   /* NUL-terminated, inside the header's blob */
	st_dtype dtype;
	uint32_t ndim;      /* 0 for a scalar */
	uint64_t shape[ST_MAX_DIMS];
	uint64_t begin;     /* offsets relative to the data buffer; end - begin = nbytes */
	uint64_t end;
} st_tensor;

typedef struct st_meta {
	const char *key;    /* NUL-terminated, inside the blob */
	const char *value;
} st_meta;

typedef struct st_header {
	st_tensor *t;       /* n tensors sorted by data offset (file order) */
	size_t n;
	uint32_t *by_name;  /* n indices into t, sorted by name (for st_find) */
	st_meta *meta;      /* nmeta entries sorted by key */
	size_t nmeta;
	char *blob;         /* owns every name, key and value string */
	uint64_t json_len;  /* N: bytes of JSON (with its padding) */
	uint64_t data_start;/* 8 + N: file offset of the data buffer */
	uint64_t data_len;  /* bytes of the data buffer (sum of tensor sizes) */
} st_header;

/* Number of elements of t (1 for a scalar, 0 if any dim is 0). Valid only for tensors that
 * passed st_parse_header (their element count is known not to overflow). */
uint64_t st_numel(const st_tensor *t);

/* Parses and validates the header of a file. json/json_len are the N header bytes (not
 * NUL-terminated); file_size is the size of the whole file. fname is used in messages only.
 * Rules: JSON text is valid UTF-8 starting with '{', trailing whitespace only; no duplicate
 * keys; "__metadata__" maps strings to strings; each tensor has a known dtype, a shape of
 * non-negative integers (at most ST_MAX_DIMS), data_offsets [begin, end] with begin <= end;
 * end - begin = numel * bits / 8 with numel * bits a multiple of 8 and no overflow; sorted by
 * begin the tensors start at 0 and tile the data buffer without holes or overlaps; and
 * 8 + N + data length equals file_size. On success fills *h (free with st_header_free) and
 * returns 0; on failure returns -1 with a message naming fname, the tensor and the rule. */
int st_parse_header(const char *json, uint64_t json_len, uint64_t file_size, const char *fname,
		    st_header *h, tp_err *e);

/* Reads and validates the header of an open file (pread: the file offset is not used).
 * Checks the prefix rules first (file at least 8 bytes, N <= ST_HEADER_MAX, 8 + N inside the
 * file) and then st_parse_header. */
int st_read_fd(int fd, uint64_t file_size, const char *fname, st_header *h, tp_err *e);

void st_header_free(st_header *h);

/* The tensor called name, or NULL. O(log n). */
const st_tensor *st_find(const st_header *h, const char *name);

/* ---- writing headers ---- */

/* An output buffer: with p == NULL only counts bytes (to size a header before writing it). */
typedef struct st_wbuf {
	char *p;          /* output, or NULL to count */
	uint64_t len;     /* bytes written (or counted) so far */
	uint64_t entries; /* top-level entries written, for the commas */
} st_wbuf;

/* Starts a header: reserves the 8-byte prefix, opens the object, writes __metadata__ (keys in
 * the given order) when nmeta > 0. */
void st_w_begin(st_wbuf *w, const st_meta *meta, size_t nmeta);
/* The same with extra entries written after meta's; an entry of meta whose key an extra entry
 * also has is left out (the extra value wins, so keys stay unique). */
void st_w_begin_x(st_wbuf *w, const st_meta *meta, size_t nmeta, const st_meta *extra, size_t nextra);
/* Writes one tensor entry; entries must be written in data order. */
void st_w_tensor(st_wbuf *w, const char *name, st_dtype dtype, uint32_t ndim,
		 const uint64_t *shape, uint64_t begin, uint64_t end);
/* Closes the object, pads with spaces so that the total (prefix + JSON) is a multiple of 8,
 * fills the prefix; returns the total header size in bytes (the data buffer starts there). */
uint64_t st_w_end(st_wbuf *w);
/* Writes s as a JSON string literal (quotes and escapes included). */
void st_w_json_string(st_wbuf *w, const char *s);
void st_w_raw(st_wbuf *w, const char *s, size_t n);
void st_w_u64(st_wbuf *w, uint64_t v);

/* The official writer's order: dtype size descending, then name (bytewise). Returns <0, 0, >0. */
int st_writer_cmp(st_dtype da, const char *na, st_dtype db, const char *nb);

#endif
