/* json_strict.c: a validator of JSON text by Python's rules (see json_strict.h), run before
 * cJSON parses config.json, index files and plan files. A recursive descent over the bytes that
 * builds nothing: it only says where the text stops being what Python's json reads. */
#include "json_strict.h"

#include <cjson/cJSON.h>
#include <stdint.h>
#include <string.h>

typedef struct jscan {
	const unsigned char *s;
	size_t n, i;
	const char *why; /* Python's message (or ours, for what Python reads and cJSON cannot) */
	size_t at;       /* where */
} jscan;

static int bad(jscan *c, size_t at, const char *why)
{
	c->why = why;
	c->at = at;
	return -1;
}

static void ws(jscan *c)
{
	while (c->i < c->n && (c->s[c->i] == ' ' || c->s[c->i] == '\t' || c->s[c->i] == '\n' || c->s[c->i] == '\r'))
		c->i++;
}

static int hex4(jscan *c, size_t at, unsigned *v)
{
	*v = 0;
	for (int k = 0; k < 4; k++) {
		unsigned char h = at + (size_t)k < c->n ? c->s[at + (size_t)k] : 0;
		unsigned d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10
			   : h >= 'A' && h <= 'F' ? h - 'A' + 10 : 16;
		if (d == 16)
			return -1;
		*v = *v << 4 | d;
	}
	return 0;
}

/* One UTF-8 sequence at c->i (its first byte >= 0x80), strictly: no overlong forms, no
 * surrogates, nothing past U+10FFFF (Python's utf-8 codec). */
static int utf8(jscan *c)
{
	const unsigned char *p = c->s + c->i;
	size_t left = c->n - c->i, need;
	uint32_t cp;
	if (p[0] >= 0xc2 && p[0] <= 0xdf)
		need = 1, cp = p[0] & 0x1fu;
	else if (p[0] >= 0xe0 && p[0] <= 0xef)
		need = 2, cp = p[0] & 0x0fu;
	else if (p[0] >= 0xf0 && p[0] <= 0xf4)
		need = 3, cp = p[0] & 0x07u;
	else
		return bad(c, c->i, "not UTF-8 (Python reads the file as UTF-8: UnicodeDecodeError)");
	if (left <= need)
		return bad(c, c->i, "not UTF-8: a sequence cut short (UnicodeDecodeError)");
	for (size_t k = 1; k <= need; k++) {
		if ((p[k] & 0xc0) != 0x80)
			return bad(c, c->i, "not UTF-8 (Python reads the file as UTF-8: UnicodeDecodeError)");
		cp = cp << 6 | (p[k] & 0x3fu);
	}
	if ((need == 2 && cp < 0x800) || (need == 3 && (cp < 0x10000 || cp > 0x10ffff)) || (cp >= 0xd800 && cp <= 0xdfff))
		return bad(c, c->i, "not UTF-8: an overlong form or a surrogate (UnicodeDecodeError)");
	c->i += need + 1;
	return 0;
}

static int string(jscan *c)
{
	size_t start = c->i++;
	for (;;) {
		if (c->i >= c->n)
			return bad(c, start, "Unterminated string starting at");
		unsigned char ch = c->s[c->i];
		if (ch == '"') {
			c->i++;
			return 0;
		}
		if (ch < 0x20)
			return bad(c, c->i, "Invalid control character at (a raw control character inside a string; "
					    "write it as an escape such as \\t or \\u0000)");
		if (ch >= 0x80) {
			if (utf8(c) < 0)
				return -1;
			continue;
		}
		if (ch != '\\') {
			c->i++;
			continue;
		}
		size_t at = c->i;
		unsigned char x = at + 1 < c->n ? c->s[at + 1] : 0;
		if (x != 'u') {
			if (!x || !strchr("\"\\/bfnrt", x))
				return bad(c, at, "Invalid \\escape");
			c->i += 2;
			continue;
		}
		unsigned v, w;
		if (hex4(c, at + 2, &v) < 0)
			return bad(c, at, "Invalid \\uXXXX escape");
		c->i += 6;
		if (v == 0)
			return bad(c, at, "\\u0000 in a string: tpfs's parser (cJSON) would cut the string there");
		if (v >= 0xdc00 && v <= 0xdfff)
			return bad(c, at, "an unpaired surrogate escape (\\udc00-\\udfff): tpfs's parser would not read "
					  "it as Python does");
		if (v >= 0xd800 && v <= 0xdbff) {
			if (c->i + 1 >= c->n || c->s[c->i] != '\\' || c->s[c->i + 1] != 'u' || hex4(c, c->i + 2, &w) < 0 ||
			    w < 0xdc00 || w > 0xdfff)
				return bad(c, at, "an unpaired surrogate escape (\\ud800-\\udbff): tpfs's parser would not "
						  "read it as Python does");
			c->i += 6;
		}
	}
}

static int digits(jscan *c)
{
	size_t s = c->i;
	while (c->i < c->n && c->s[c->i] >= '0' && c->s[c->i] <= '9')
		c->i++;
	return c->i > s ? 0 : -1;
}

/* -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)? and nothing glued to it. */
static int number(jscan *c)
{
	size_t start = c->i;
	if (c->s[c->i] == '-')
		c->i++;
	if (c->i < c->n && c->s[c->i] == '0') {
		c->i++;
		if (c->i < c->n && c->s[c->i] >= '0' && c->s[c->i] <= '9')
			return bad(c, start, "a number with a leading zero, which JSON does not allow (Extra data)");
	} else if (digits(c) < 0) {
		return bad(c, start, "Expecting value");
	}
	if (c->i < c->n && c->s[c->i] == '.') {
		c->i++;
		if (digits(c) < 0)
			return bad(c, start, "a number ending in '.', which JSON does not allow (Extra data)");
	}
	if (c->i < c->n && (c->s[c->i] == 'e' || c->s[c->i] == 'E')) {
		c->i++;
		if (c->i < c->n && (c->s[c->i] == '+' || c->s[c->i] == '-'))
			c->i++;
		if (digits(c) < 0)
			return bad(c, start, "a number with an empty exponent, which JSON does not allow (Extra data)");
	}
	return 0;
}

static int lit(jscan *c, const char *w)
{
	size_t l = strlen(w);
	if (c->n - c->i >= l && !memcmp(c->s + c->i, w, l)) {
		c->i += l;
		return 1;
	}
	return 0;
}

static int value(jscan *c, int depth)
{
	ws(c);
	if (c->i >= c->n)
		return bad(c, c->i, "Expecting value");
	if (depth > TP_JSON_MAX_DEPTH)
		return bad(c, c->i, "nested deeper than 200 levels, the tpfs limit");
	unsigned char ch = c->s[c->i];
	size_t at = c->i;
	if (ch == '{' || ch == '[') {
		unsigned char close = ch == '{' ? '}' : ']';
		c->i++;
		ws(c);
		if (c->i < c->n && c->s[c->i] == close) {
			c->i++;
			return 0;
		}
		for (;;) {
			if (ch == '{') {
				ws(c);
				if (c->i >= c->n || c->s[c->i] != '"')
					return bad(c, c->i, "Expecting property name enclosed in double quotes");
				if (string(c) < 0)
					return -1;
				ws(c);
				if (c->i >= c->n || c->s[c->i] != ':')
					return bad(c, c->i, "Expecting ':' delimiter");
				c->i++;
			}
			if (value(c, depth + 1) < 0)
				return -1;
			ws(c);
			if (c->i < c->n && c->s[c->i] == close) {
				c->i++;
				return 0;
			}
			if (c->i >= c->n || c->s[c->i] != ',')
				return bad(c, c->i, "Expecting ',' delimiter");
			c->i++;
		}
	}
	if (ch == '"')
		return string(c);
	if (ch == '-' || (ch >= '0' && ch <= '9')) {
		if (lit(c, "-Infinity"))
			return bad(c, at, "-Infinity: Python's json reads it, tpfs's parser does not (write null or a number)");
		return number(c);
	}
	if (lit(c, "true") || lit(c, "false") || lit(c, "null"))
		return 0;
	if (lit(c, "NaN") || lit(c, "Infinity"))
		return bad(c, at, "NaN or Infinity: Python's json reads it, tpfs's parser does not (write null or a number)");
	return bad(c, at, "Expecting value");
}

int tp_json_python(const char *what, const char *text, size_t len, tp_err *e)
{
	jscan c = {.s = (const unsigned char *)text, .n = len};
	int rc = 0;
	if (len >= 3 && !memcmp(text, "\xef\xbb\xbf", 3))
		rc = bad(&c, 0, "Unexpected UTF-8 BOM (a byte-order mark; save the file without one)");
	else if (value(&c, 0) == 0) {
		ws(&c);
		if (c.i < c.n)
			rc = bad(&c, c.i, "Extra data (more after the first JSON value)");
	} else {
		rc = -1;
	}
	if (rc == 0)
		return 0;
	size_t line = 1, col = 1;
	for (size_t k = 0; k < c.at && k < len; k++) {
		if (text[k] == '\n')
			line++, col = 1;
		else
			col++;
	}
	return tp_fail(e, TP_EINVAL, "%s: line %zu column %zu (char %zu): %s; refused: a loader reading it with "
		       "Python's json would not see what tpfs planned from", what, line, col, c.at, c.why);
}

cJSON *tp_json_parse(const char *what, const char *text, size_t len, tp_err *e)
{
	if (tp_json_python(what, text, len, e) < 0)
		return NULL;
	cJSON *j = cJSON_ParseWithLength(text, len);
	if (!j) {
		tp_json_fail(e, what, text, len, cJSON_GetErrorPtr());
		return NULL;
	}
	if (tp_json_unique(e, what, j) < 0) {
		cJSON_Delete(j);
		return NULL;
	}
	return j;
}
