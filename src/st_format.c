/* st_format.c: parsing, validation and writing of safetensors headers (see st_format.h).
 *
 * Parsing is two passes over untrusted bytes: a lexical pass (UTF-8, control characters,
 * escaped NULs, numbers that are not plain non-negative integers) that cJSON would otherwise
 * accept or silently round, then cJSON and a structural pass over the tree. Nothing is
 * allocated in proportion to a number read from the header, only to the header's length.
 */
#include "st_format.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const struct {
	const char *name;
	unsigned bits;
} dtypes[ST_NDTYPES] = {
	[ST_BOOL] = {"BOOL", 8},
	[ST_F4] = {"F4", 4},
	[ST_F6_E2M3] = {"F6_E2M3", 6},
	[ST_F6_E3M2] = {"F6_E3M2", 6},
	[ST_U8] = {"U8", 8},
	[ST_I8] = {"I8", 8},
	[ST_F8_E5M2] = {"F8_E5M2", 8},
	[ST_F8_E4M3] = {"F8_E4M3", 8},
	[ST_F8_E8M0] = {"F8_E8M0", 8},
	[ST_F8_E4M3FNUZ] = {"F8_E4M3FNUZ", 8},
	[ST_F8_E5M2FNUZ] = {"F8_E5M2FNUZ", 8},
	[ST_I16] = {"I16", 16},
	[ST_U16] = {"U16", 16},
	[ST_F16] = {"F16", 16},
	[ST_BF16] = {"BF16", 16},
	[ST_I32] = {"I32", 32},
	[ST_U32] = {"U32", 32},
	[ST_F32] = {"F32", 32},
	[ST_C64] = {"C64", 64},
	[ST_F64] = {"F64", 64},
	[ST_I64] = {"I64", 64},
	[ST_U64] = {"U64", 64},
};

const char *st_dtype_name(st_dtype d)
{
	return (unsigned)d < ST_NDTYPES ? dtypes[d].name : NULL;
}

unsigned st_dtype_bits(st_dtype d)
{
	return (unsigned)d < ST_NDTYPES ? dtypes[d].bits : 0;
}

int st_dtype_parse(const char *s, size_t len, st_dtype *out)
{
	for (int i = 0; i < ST_NDTYPES; i++) {
		if (strlen(dtypes[i].name) == len && memcmp(dtypes[i].name, s, len) == 0) {
			*out = (st_dtype)i;
			return 0;
		}
	}
	return -1;
}

uint64_t st_numel(const st_tensor *t)
{
	uint64_t n = 1;
	for (uint32_t i = 0; i < t->ndim; i++)
		n *= t->shape[i];
	return n;
}

/* ---- lexical pass ---- */

/* Length of the UTF-8 sequence starting at p (at most n bytes), or 0 if invalid
 * (overlong forms, surrogates and code points past U+10FFFF are invalid). */
static size_t utf8_len(const unsigned char *p, uint64_t n)
{
	unsigned char c = p[0];
	if (c < 0x80)
		return 1;
	size_t len;
	uint32_t cp;
	if (c >= 0xC2 && c <= 0xDF) {
		len = 2;
		cp = c & 0x1F;
	} else if (c >= 0xE0 && c <= 0xEF) {
		len = 3;
		cp = c & 0x0F;
	} else if (c >= 0xF0 && c <= 0xF4) {
		len = 4;
		cp = c & 0x07;
	} else {
		return 0;
	}
	if (n < len)
		return 0;
	for (size_t i = 1; i < len; i++) {
		if ((p[i] & 0xC0) != 0x80)
			return 0;
		cp = (cp << 6) | (p[i] & 0x3F);
	}
	if ((len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) || cp > 0x10FFFF ||
	    (cp >= 0xD800 && cp <= 0xDFFF))
		return 0;
	return len;
}

static int is_digit(unsigned char c)
{
	return c >= '0' && c <= '9';
}

/* Checks what cJSON does not: valid UTF-8, no raw control characters or escaped NULs inside
 * strings, and every number a plain run of digits (no sign, fraction, exponent or leading zero). */
static int lint_json(const char *json, uint64_t len, const char *fname, tp_err *e)
{
	const unsigned char *p = (const unsigned char *)json;
	int in_str = 0;
	uint64_t depth = 0, top = 0; /* nesting, and commas at the top level (entries - 1) */
	for (uint64_t i = 0; i < len;) {
		unsigned char c = p[i];
		if (c >= 0x80) {
			size_t l = utf8_len(p + i, len - i);
			if (!l)
				return tp_fail(e, TP_EINVAL, "%s: header: invalid UTF-8 at header byte %llu",
					       fname, (unsigned long long)i);
			i += l;
			continue;
		}
		if (in_str) {
			if (c == '"') {
				in_str = 0;
			} else if (c < 0x20) {
				return tp_fail(e, TP_EINVAL,
					       "%s: header: raw control character 0x%02x inside a string at header byte %llu",
					       fname, c, (unsigned long long)i);
			} else if (c == '\\') {
				if (i + 1 >= len)
					break; /* cJSON reports the unterminated string */
				if (p[i + 1] == 'u' && i + 5 < len && memcmp(p + i + 2, "0000", 4) == 0)
					return tp_fail(e, TP_EINVAL,
						       "%s: header: escaped NUL (\\u0000) inside a string at header byte %llu",
						       fname, (unsigned long long)i);
				i += 2;
				continue;
			}
		} else if (c == '"') {
			in_str = 1;
		} else if (c == '{' || c == '[') {
			depth++;
		} else if (c == '}' || c == ']') {
			depth -= depth > 0;
		} else if (c == ',' && depth == 1 && ++top > ST_MAX_TENSORS) {
			/* refuse before cJSON spends memory on a million entries (the +1 is __metadata__) */
			return tp_fail(e, TP_ELIMIT, "%s: more than %d tensors, the tpfs limit per file", fname,
				       ST_MAX_TENSORS);
		} else if (c == '0' && (i == 0 || !is_digit(p[i - 1])) && i + 1 < len && is_digit(p[i + 1])) {
			/* JSON has no leading zeros, and the safetensors package refuses them */
			return tp_fail(e, TP_EINVAL, "%s: header: number with a leading zero at header byte %llu",
				       fname, (unsigned long long)i);
		} else if (c == '-') {
			return tp_fail(e, TP_EINVAL, "%s: header: negative number at header byte %llu",
				       fname, (unsigned long long)i);
		} else if (c == '.' && i > 0 && is_digit(p[i - 1])) {
			return tp_fail(e, TP_EINVAL, "%s: header: fractional number at header byte %llu",
				       fname, (unsigned long long)i);
		} else if ((c == 'e' || c == 'E') && i > 0 && is_digit(p[i - 1])) {
			return tp_fail(e, TP_EINVAL,
				       "%s: header: number in exponent form at header byte %llu", fname,
				       (unsigned long long)i);
		}
		i++;
	}
	return 0;
}

/* ---- structural pass ---- */

#define EXACT_MAX 9007199254740992.0 /* 2^53: integers above this are not exact in a double */

/* Reads a JSON number that the lexical pass left as plain digits. */
static int get_u64(const cJSON *v, uint64_t *out)
{
	if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble >= EXACT_MAX)
		return -1;
	*out = (uint64_t)v->valuedouble;
	if ((double)*out != v->valuedouble)
		return -1;
	return 0;
}

static int cmp_name_ptr(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int cmp_offsets(const void *a, const void *b)
{
	const st_tensor *x = a, *y = b;
	if (x->begin != y->begin)
		return x->begin < y->begin ? -1 : 1;
	if (x->end != y->end)
		return x->end < y->end ? -1 : 1;
	return strcmp(x->name, y->name);
}

static int cmp_by_name(const void *a, const void *b, void *base)
{
	const st_tensor *t = base;
	return strcmp(t[*(const uint32_t *)a].name, t[*(const uint32_t *)b].name);
}

static int cmp_meta(const void *a, const void *b)
{
	return strcmp(((const st_meta *)a)->key, ((const st_meta *)b)->key);
}

/* Copies s into the blob at *pos and returns the copy. The blob is sized to the header's
 * length, which bounds the total of all strings. */
static const char *blob_put(char *blob, size_t *pos, const char *s)
{
	size_t l = strlen(s) + 1;
	char *d = blob + *pos;
	memcpy(d, s, l);
	*pos += l;
	return d;
}

static int parse_tensor(const cJSON *item, const char *fname, st_tensor *t, tp_err *e)
{
	const char *name = item->string;
	if (!cJSON_IsObject(item))
		return tp_fail(e, TP_EINVAL, "%s: tensor '%s': entry is not an object", fname, name);
	const cJSON *dt = cJSON_GetObjectItemCaseSensitive(item, "dtype");
	const cJSON *sh = cJSON_GetObjectItemCaseSensitive(item, "shape");
	const cJSON *off = cJSON_GetObjectItemCaseSensitive(item, "data_offsets");
	if (!dt || !sh || !off)
		return tp_fail(e, TP_EINVAL, "%s: tensor '%s': missing field '%s'", fname, name,
			       !dt ? "dtype" : !sh ? "shape" : "data_offsets");
	if (!cJSON_IsString(dt) ||
	    st_dtype_parse(dt->valuestring, strlen(dt->valuestring), &t->dtype) < 0)
		return tp_fail(e, TP_EINVAL, "%s: tensor '%s': unknown dtype %s%s%s", fname, name,
			       cJSON_IsString(dt) ? "'" : "", cJSON_IsString(dt) ? dt->valuestring : "(not a string)",
			       cJSON_IsString(dt) ? "'" : "");
	if (!cJSON_IsArray(sh))
		return tp_fail(e, TP_EINVAL, "%s: tensor '%s': shape is not an array", fname, name);
	int nd = cJSON_GetArraySize(sh);
	if (nd > ST_MAX_DIMS)
		return tp_fail(e, TP_ELIMIT,
			       "%s: tensor '%s': %d dimensions, more than the tpfs limit of %d", fname,
			       name, nd, ST_MAX_DIMS);
	t->ndim = (uint32_t)nd;
	int i = 0;
	const cJSON *d;
	cJSON_ArrayForEach(d, sh)
	{
		if (get_u64(d, &t->shape[i]) < 0)
			return tp_fail(e, TP_EINVAL,
				       "%s: tensor '%s': shape[%d] is not a non-negative integer below 2^53",
				       fname, name, i);
		i++;
	}
	if (!cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2)
		return tp_fail(e, TP_EINVAL, "%s: tensor '%s': data_offsets is not an array of two integers",
			       fname, name);
	if (get_u64(cJSON_GetArrayItem(off, 0), &t->begin) < 0 ||
	    get_u64(cJSON_GetArrayItem(off, 1), &t->end) < 0)
		return tp_fail(e, TP_EINVAL,
			       "%s: tensor '%s': data_offsets holds a value that is not a non-negative integer below 2^53",
			       fname, name);
	if (t->end < t->begin)
		return tp_fail(e, TP_EINVAL, "%s: tensor '%s': data_offsets [%llu, %llu] end before begin",
			       fname, name, (unsigned long long)t->begin, (unsigned long long)t->end);
	unsigned long long numel = 1, bits;
	for (uint32_t k = 0; k < t->ndim; k++)
		if (tp_mul64(numel, t->shape[k], &numel) < 0)
			return tp_fail(e, TP_EINVAL, "%s: tensor '%s': element count overflows 64 bits",
				       fname, name);
	if (tp_mul64(numel, st_dtype_bits(t->dtype), &bits) < 0)
		return tp_fail(e, TP_EINVAL, "%s: tensor '%s': bit count overflows 64 bits", fname, name);
	if (bits % 8)
		return tp_fail(e, TP_EINVAL,
			       "%s: tensor '%s': %llu elements of %s are %llu bits, not a whole number of bytes",
			       fname, name, numel, st_dtype_name(t->dtype), bits);
	if (t->end - t->begin != bits / 8)
		return tp_fail(e, TP_EINVAL,
			       "%s: tensor '%s': data_offsets [%llu, %llu] hold %llu bytes but shape and dtype %s need %llu",
			       fname, name, (unsigned long long)t->begin, (unsigned long long)t->end,
			       (unsigned long long)(t->end - t->begin), st_dtype_name(t->dtype), bits / 8);
	return 0;
}

int st_parse_header(const char *json, uint64_t json_len, uint64_t file_size, const char *fname,
		    st_header *h, tp_err *e)
{
	memset(h, 0, sizeof *h);
	if (json_len > ST_HEADER_MAX)
		return tp_fail(e, TP_EINVAL, "%s: header length %llu exceeds the limit of %llu bytes",
			       fname, (unsigned long long)json_len, ST_HEADER_MAX);
	if (json_len == 0 || json[0] != '{')
		return tp_fail(e, TP_EINVAL, "%s: header does not start with '{'", fname);
	if (lint_json(json, json_len, fname, e) < 0)
		return -1;

	const char *end = NULL;
	cJSON *root = cJSON_ParseWithLengthOpts(json, (size_t)json_len, &end, 0);
	if (!root) {
		const char *at = cJSON_GetErrorPtr();
		unsigned long long pos = at && at >= json && at <= json + json_len ? (unsigned long long)(at - json) : 0;
		return tp_fail(e, TP_EINVAL, "%s: header is not valid JSON (near header byte %llu)", fname, pos);
	}
	for (const char *q = end; q < json + json_len; q++) {
		if (*q != ' ' && *q != '\t' && *q != '\n' && *q != '\r') {
			cJSON_Delete(root);
			return tp_fail(e, TP_EINVAL,
				       "%s: header has bytes other than whitespace after the JSON object (header byte %llu)",
				       fname, (unsigned long long)(q - json));
		}
	}
	if (!cJSON_IsObject(root)) {
		cJSON_Delete(root);
		return tp_fail(e, TP_EINVAL, "%s: header is not a JSON object", fname);
	}

	int rc = -1;
	size_t nent = 0;
	const cJSON *it;
	cJSON_ArrayForEach(it, root) nent++;
	const cJSON *metaobj = NULL;
	const char **names = calloc(nent ? nent : 1, sizeof *names);
	h->blob = malloc(json_len + 1);
	h->t = calloc(nent ? nent : 1, sizeof *h->t);
	if (!names || !h->blob || !h->t) {
		tp_fail(e, TP_ENOMEM, "%s: out of memory parsing a %llu-byte header", fname,
			(unsigned long long)json_len);
		goto out;
	}
	size_t k = 0, pos = 0;
	cJSON_ArrayForEach(it, root)
	{
		if (strlen(it->string) > ST_MAX_NAME) {
			tp_fail(e, TP_ELIMIT, "%s: a key of %zu bytes exceeds the tpfs limit of %d bytes",
				fname, strlen(it->string), ST_MAX_NAME);
			goto out;
		}
		names[k++] = it->string;
	}
	qsort(names, nent, sizeof *names, cmp_name_ptr);
	for (size_t i = 1; i < nent; i++) {
		if (strcmp(names[i - 1], names[i]) == 0) {
			tp_fail(e, TP_EINVAL, "%s: tensor '%s': duplicate key in header", fname, names[i]);
			goto out;
		}
	}

	cJSON_ArrayForEach(it, root)
	{
		if (strcmp(it->string, "__metadata__") == 0) {
			metaobj = it;
			continue;
		}
		if (h->n >= ST_MAX_TENSORS) {
			tp_fail(e, TP_ELIMIT, "%s: more than %d tensors, the tpfs limit per file", fname,
				ST_MAX_TENSORS);
			goto out;
		}
		st_tensor *t = &h->t[h->n];
		if (parse_tensor(it, fname, t, e) < 0)
			goto out;
		t->name = blob_put(h->blob, &pos, it->string);
		h->n++;
	}
	if (metaobj && !cJSON_IsNull(metaobj)) {
		if (!cJSON_IsObject(metaobj)) {
			tp_fail(e, TP_EINVAL, "%s: __metadata__ is not an object", fname);
			goto out;
		}
		size_t nm = 0;
		cJSON_ArrayForEach(it, metaobj) nm++;
		h->meta = calloc(nm ? nm : 1, sizeof *h->meta);
		if (!h->meta) {
			tp_fail(e, TP_ENOMEM, "%s: out of memory", fname);
			goto out;
		}
		cJSON_ArrayForEach(it, metaobj)
		{
			if (!cJSON_IsString(it)) {
				tp_fail(e, TP_EINVAL, "%s: __metadata__ value of '%s' is not a string", fname,
					it->string);
				goto out;
			}
			h->meta[h->nmeta].key = blob_put(h->blob, &pos, it->string);
			h->meta[h->nmeta].value = blob_put(h->blob, &pos, it->valuestring);
			h->nmeta++;
		}
		qsort(h->meta, h->nmeta, sizeof *h->meta, cmp_meta);
		for (size_t i = 1; i < h->nmeta; i++) {
			if (strcmp(h->meta[i - 1].key, h->meta[i].key) == 0) {
				tp_fail(e, TP_EINVAL, "%s: __metadata__: duplicate key '%s'", fname, h->meta[i].key);
				goto out;
			}
		}
	}

	/* Offsets: sorted by begin, the tensors must tile [0, data_len) exactly. */
	qsort(h->t, h->n, sizeof *h->t, cmp_offsets);
	uint64_t expect = 0;
	for (size_t i = 0; i < h->n; i++) {
		const st_tensor *t = &h->t[i];
		if (t->begin != expect) {
			tp_fail(e, TP_EINVAL,
				"%s: tensor '%s': data_offsets [%llu, %llu] %s: expected it to begin at %llu",
				fname, t->name, (unsigned long long)t->begin, (unsigned long long)t->end,
				t->begin > expect ? "leave a hole before it" : "overlap the previous tensor",
				(unsigned long long)expect);
			goto out;
		}
		expect = t->end;
	}
	h->json_len = json_len;
	h->data_start = ST_PREFIX + json_len;
	h->data_len = expect;
	if (h->data_start + h->data_len != file_size) {
		tp_fail(e, TP_EINVAL,
			"%s: file is %llu bytes but the header describes %llu (8 + %llu header + %llu data)%s",
			fname, (unsigned long long)file_size,
			(unsigned long long)(h->data_start + h->data_len), (unsigned long long)json_len,
			(unsigned long long)h->data_len,
			file_size < h->data_start + h->data_len ? ": truncated" : ": trailing bytes");
		goto out;
	}
	h->by_name = malloc((h->n ? h->n : 1) * sizeof *h->by_name);
	if (!h->by_name) {
		tp_fail(e, TP_ENOMEM, "%s: out of memory", fname);
		goto out;
	}
	for (size_t i = 0; i < h->n; i++)
		h->by_name[i] = (uint32_t)i;
	qsort_r(h->by_name, h->n, sizeof *h->by_name, cmp_by_name, h->t);
	rc = 0;
out:
	free(names);
	cJSON_Delete(root);
	if (rc < 0)
		st_header_free(h);
	return rc;
}

int st_read_fd(int fd, uint64_t file_size, const char *fname, st_header *h, tp_err *e)
{
	memset(h, 0, sizeof *h);
	unsigned char pre[ST_PREFIX];
	if (file_size < ST_PREFIX)
		return tp_fail(e, TP_EINVAL, "%s: file is %llu bytes, shorter than the 8-byte header length",
			       fname, (unsigned long long)file_size);
	ssize_t r = pread(fd, pre, ST_PREFIX, 0);
	if (r != ST_PREFIX)
		return tp_fail(e, TP_EIO, "%s: cannot read the header length: %s", fname,
			       r < 0 ? strerror(errno) : "short read");
	uint64_t n = 0;
	for (int i = 7; i >= 0; i--)
		n = (n << 8) | pre[i];
	if (n > ST_HEADER_MAX)
		return tp_fail(e, TP_EINVAL, "%s: header length %llu exceeds the limit of %llu bytes",
			       fname, (unsigned long long)n, ST_HEADER_MAX);
	if (n > file_size - ST_PREFIX)
		return tp_fail(e, TP_EINVAL,
			       "%s: header length %llu runs past the end of the %llu-byte file", fname,
			       (unsigned long long)n, (unsigned long long)file_size);
	char *buf = malloc(n ? n : 1);
	if (!buf)
		return tp_fail(e, TP_ENOMEM, "%s: out of memory for a %llu-byte header", fname,
			       (unsigned long long)n);
	uint64_t got = 0;
	while (got < n) {
		r = pread(fd, buf + got, n - got, (off_t)(ST_PREFIX + got));
		if (r <= 0) {
			free(buf);
			return tp_fail(e, TP_EIO, "%s: cannot read the header: %s", fname,
				       r < 0 ? strerror(errno) : "file shrank while reading");
		}
		got += (uint64_t)r;
	}
	int rc = st_parse_header(buf, n, file_size, fname, h, e);
	free(buf);
	return rc;
}

void st_header_free(st_header *h)
{
	free(h->t);
	free(h->by_name);
	free(h->meta);
	free(h->blob);
	memset(h, 0, sizeof *h);
}

const st_tensor *st_find(const st_header *h, const char *name)
{
	size_t lo = 0, hi = h->n;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		const st_tensor *t = &h->t[h->by_name[mid]];
		int c = strcmp(name, t->name);
		if (c == 0)
			return t;
		if (c < 0)
			hi = mid;
		else
			lo = mid + 1;
	}
	return NULL;
}

/* ---- writing ---- */

void st_w_raw(st_wbuf *w, const char *s, size_t n)
{
	if (w->p)
		memcpy(w->p + w->len, s, n);
	w->len += n;
}

static void w_str(st_wbuf *w, const char *s)
{
	st_w_raw(w, s, strlen(s));
}

void st_w_u64(st_wbuf *w, uint64_t v)
{
	char tmp[24];
	int i = sizeof tmp;
	do {
		tmp[--i] = (char)('0' + v % 10);
		v /= 10;
	} while (v);
	st_w_raw(w, tmp + i, sizeof tmp - (size_t)i);
}

void st_w_json_string(st_wbuf *w, const char *s)
{
	static const char hex[] = "0123456789abcdef";
	st_w_raw(w, "\"", 1);
	const char *run = s;
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;
		if (c >= 0x20 && c != '"' && c != '\\')
			continue;
		st_w_raw(w, run, (size_t)(s - run));
		char esc[6] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15]};
		if (c == '"' || c == '\\') {
			esc[1] = (char)c;
			st_w_raw(w, esc, 2);
		} else {
			st_w_raw(w, esc, 6);
		}
		run = s + 1;
	}
	st_w_raw(w, run, (size_t)(s - run));
	st_w_raw(w, "\"", 1);
}

void st_w_begin(st_wbuf *w, const st_meta *meta, size_t nmeta)
{
	st_w_begin_x(w, meta, nmeta, NULL, 0);
}

void st_w_begin_x(st_wbuf *w, const st_meta *meta, size_t nmeta, const st_meta *extra, size_t nextra)
{
	w->len = 0;
	w->entries = 0;
	st_w_raw(w, "\0\0\0\0\0\0\0\0{", ST_PREFIX + 1);
	if (nmeta + nextra) {
		w_str(w, "\"__metadata__\":{");
		size_t k = 0;
		for (size_t i = 0; i < nmeta + nextra; i++) {
			const st_meta *m = i < nmeta ? &meta[i] : &extra[i - nmeta];
			size_t x = 0;
			while (i < nmeta && x < nextra && strcmp(extra[x].key, m->key))
				x++;
			if (i < nmeta && x < nextra)
				continue; /* replaced by an extra entry */
			if (k++)
				st_w_raw(w, ",", 1);
			st_w_json_string(w, m->key);
			st_w_raw(w, ":", 1);
			st_w_json_string(w, m->value);
		}
		st_w_raw(w, "}", 1);
		w->entries++;
	}
}

void st_w_tensor(st_wbuf *w, const char *name, st_dtype dtype, uint32_t ndim,
		 const uint64_t *shape, uint64_t begin, uint64_t end)
{
	if (w->entries++)
		st_w_raw(w, ",", 1);
	st_w_json_string(w, name);
	w_str(w, ":{\"dtype\":\"");
	w_str(w, st_dtype_name(dtype));
	w_str(w, "\",\"shape\":[");
	for (uint32_t i = 0; i < ndim; i++) {
		if (i)
			st_w_raw(w, ",", 1);
		st_w_u64(w, shape[i]);
	}
	w_str(w, "],\"data_offsets\":[");
	st_w_u64(w, begin);
	st_w_raw(w, ",", 1);
	st_w_u64(w, end);
	st_w_raw(w, "]}", 2);
}

uint64_t st_w_end(st_wbuf *w)
{
	st_w_raw(w, "}", 1);
	while (w->len % 8)
		st_w_raw(w, " ", 1);
	if (w->p) {
		uint64_t n = w->len - ST_PREFIX;
		for (int i = 0; i < 8; i++)
			w->p[i] = (char)((n >> (8 * i)) & 0xFF);
	}
	return w->len;
}

int st_writer_cmp(st_dtype da, const char *na, st_dtype db, const char *nb)
{
	unsigned ba = st_dtype_bits(da), bb = st_dtype_bits(db);
	if (ba != bb)
		return ba > bb ? -1 : 1;
	return strcmp(na, nb);
}
