/* rank_config.c: rewriting config.json text for one rank (see rank_config.h).
 *
 * cJSON first checks that the text is valid JSON; a small scanner then walks it once, keeping the
 * dotted path of the current key, and records edits: a value span to replace, or a point at
 * the end of an object where a missing key is added in the style (indent, separator) of the
 * object's last member. The output is the source with the edits applied, in text order. */
#include "rank_config.h"
#include "json_strict.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_PATH 1024
#define MAX_NEST 1000 /* as cJSON */

typedef struct edit {
	size_t at, end;      /* replace src[at, end) (at == end: insert) */
	size_t set;          /* index into the set list */
	const char *indent;  /* insert: text before the key (",\n    "), its length, and the separator */
	size_t nindent;
	const char *colon;
	size_t ncolon;
	int first;           /* insert into an empty object: no comma */
} edit;

typedef struct scan {
	const char *s;
	size_t n, i;
	char path[MAX_PATH];       /* the dotted path of the current key ("" at the top) */
	int lost;                  /* > 0 inside a key whose path does not fit: nothing there matches */
	size_t plen;
	const tp_cfg_set *set;
	size_t nset;
	int *seen;
	size_t *found_in;          /* per set: the id of the last object it was found in */
	size_t objects;            /* objects entered so far (an object's id is its number) */
	edit *ed;
	size_t ned, cap;
	const char *fname;
	tp_err *e;
} scan;

/* Skips what cJSON skips between tokens: every byte up to 32 (NUL included). */
static void ws(scan *c)
{
	while (c->i < c->n && (unsigned char)c->s[c->i] <= 32)
		c->i++;
}

static int add_edit(scan *c, edit ed)
{
	if (c->ned == c->cap) {
		size_t cap = c->cap ? c->cap * 2 : 16;
		edit *p = realloc(c->ed, cap * sizeof *p);
		if (!p)
			return tp_fail(c->e, TP_ENOMEM, "out of memory");
		c->ed = p;
		c->cap = cap;
	}
	c->ed[c->ned++] = ed;
	return 0;
}

static int value(scan *c, int depth);

static void skip_string(scan *c)
{
	c->i++; /* the opening quote */
	while (c->i < c->n && c->s[c->i] != '"')
		c->i += c->s[c->i] == '\\' ? 2 : 1;
	c->i++;
}

/* Writes code point cp as UTF-8 (lone surrogates too: no set path can name them) into out[*w,
 * cap); returns -1 when it does not fit. */
static int put_utf8(char *out, size_t cap, size_t *w, unsigned long cp)
{
	unsigned char b[4];
	size_t n;
	if (cp < 0x80)
		b[0] = (unsigned char)cp, n = 1;
	else if (cp < 0x800)
		b[0] = (unsigned char)(0xc0 | cp >> 6), b[1] = (unsigned char)(0x80 | (cp & 0x3f)), n = 2;
	else if (cp < 0x10000)
		b[0] = (unsigned char)(0xe0 | cp >> 12), b[1] = (unsigned char)(0x80 | (cp >> 6 & 0x3f)),
		b[2] = (unsigned char)(0x80 | (cp & 0x3f)), n = 3;
	else
		b[0] = (unsigned char)(0xf0 | cp >> 18), b[1] = (unsigned char)(0x80 | (cp >> 12 & 0x3f)),
		b[2] = (unsigned char)(0x80 | (cp >> 6 & 0x3f)), b[3] = (unsigned char)(0x80 | (cp & 0x3f)), n = 4;
	if (*w + n > cap)
		return -1;
	memcpy(out + *w, b, n);
	*w += n;
	return 0;
}

/* The value of four hex digits, or 0 (as cJSON reads them) when one is not a hex digit. */
static unsigned long hex4(const char *s)
{
	unsigned long v = 0;
	for (int i = 0; i < 4; i++) {
		int c = (unsigned char)s[i], d = c >= '0' && c <= '9' ? c - '0' : (c | 0x20) >= 'a' && (c | 0x20) <= 'f' ? (c | 0x20) - 'a' + 10 : -1;
		if (d < 0)
			return 0;
		v = v << 4 | (unsigned long)d;
	}
	return v;
}

/* Decodes the body s[0, n) of a JSON string that cJSON has accepted into out[0, cap), as a
 * loader's JSON reader sees the key: "num_attention_he\u0061ds" is num_attention_heads.
 * Returns the decoded length; -1 when it does not fit in cap; -2 when it holds a NUL (escaped or
 * raw) or a \u without four hex digits (which cJSON reads as a NUL): readers disagree on those
 * (cJSON cuts the key there, Python keeps the NUL or refuses the file). */
static long key_decode(const char *s, size_t n, char *out, size_t cap)
{
	size_t w = 0;
	for (size_t i = 0; i < n;) {
		unsigned long cp = (unsigned char)s[i++];
		if (cp == '\\' && i < n) {
			char x = s[i++];
			cp = x == 'b' ? '\b' : x == 'f' ? '\f' : x == 'n' ? '\n' : x == 'r' ? '\r' : x == 't' ? '\t'
			     : (unsigned char)x;
			if (x == 'u' && i + 4 <= n) {
				cp = hex4(s + i);
				i += 4;
				if (cp >= 0xd800 && cp < 0xdc00 && i + 6 <= n && s[i] == '\\' && s[i + 1] == 'u') {
					unsigned long lo = hex4(s + i + 2);
					if (lo >= 0xdc00 && lo < 0xe000)
						cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00), i += 6;
				}
			}
		} else if (cp >= 0x80) { /* raw UTF-8 bytes pass as they are */
			if (w + 1 > cap)
				return -1;
			out[w++] = (char)cp;
			continue;
		}
		if (cp == 0)
			return -2;
		if (put_utf8(out, cap, &w, cp) < 0)
			return -1;
	}
	return (long)w;
}

/* Is the parent path of set k exactly path[0, plen)? Then *key receives its last component. */
static int parent_is(const scan *c, size_t k, const char **key)
{
	const char *p = c->set[k].path, *dot = strrchr(p, '.');
	size_t pl = dot ? (size_t)(dot - p) : 0;
	*key = dot ? dot + 1 : p;
	return pl == c->plen && memcmp(p, c->path, pl) == 0;
}

static int object(scan *c, int depth)
{
	size_t plen0 = c->plen, last_end = 0, ind0 = 0, ind1 = 0, col0 = 0, col1 = 0;
	int members = 0;
	size_t id = ++c->objects;
	c->i++;
	for (;;) {
		size_t w0 = c->i;
		ws(c);
		if (c->i >= c->n)
			return -1;
		if (c->s[c->i] == '}')
			break;
		if (c->s[c->i] == ',') {
			c->i++;
			continue;
		}
		if (c->s[c->i] != '"')
			return -1;
		ind0 = w0, ind1 = c->i;
		size_t k0 = c->i + 1;
		skip_string(c);
		size_t k1 = c->i - 1;
		col0 = c->i;
		ws(c);
		if (c->i >= c->n || c->s[c->i] != ':')
			return -1;
		c->i++;
		ws(c);
		col1 = c->i;
		/* the key as a reader decodes it, after the parent path and its dot; an empty key or one
		 * with a dot is not a path component a set can name, one too long is longer than any */
		size_t at = plen0 + (plen0 ? 1 : 0);
		long klen = at + 2 > MAX_PATH ? -1 : key_decode(c->s + k0, k1 - k0, c->path + at, MAX_PATH - 1 - at);
		if (klen == -2)
			return tp_fail(c->e, TP_EINVAL, "%s: a key holds a NUL character or a broken \\u escape, "
				       "which JSON readers read differently (near byte %zu)", c->fname, k0);
		int lost = klen < 0;
		int named = klen > 0 && !memchr(c->path + at, '.', (size_t)klen);
		c->lost += lost;
		if (lost)
			at = plen0, named = 0, klen = 0;
		if (plen0)
			c->path[plen0] = '.';
		if (!named && !lost)
			c->path[at] = '\\'; /* no set path names it (or what it holds) */
		c->plen = at + (named ? (size_t)klen : !lost);
		c->path[c->plen] = 0;
		size_t v0 = c->i, k = 0;
		while (k < c->nset && (c->lost || strcmp(c->set[k].path, c->path)))
			k++;
		if (k < c->nset) {
			char ch = v0 < c->n ? c->s[v0] : 0;
			if (ch != '-' && (ch < '0' || ch > '9') && strncmp(c->s + v0, "null", 4))
				return tp_fail(c->e, TP_EINVAL, "%s: \"%s\" is not a number, so it cannot hold a rank's count",
					       c->fname, c->set[k].path);
			c->seen[k]++;
			c->found_in[k] = id;
		}
		if (value(c, depth + 1) < 0)
			return -1;
		if (k < c->nset && add_edit(c, (edit){.at = v0, .end = c->i, .set = k}) < 0)
			return -1;
		last_end = c->i;
		members++;
		c->lost -= lost;
		c->plen = plen0;
		c->path[plen0] = 0;
	}
	/* add the missing keys whose object this is (after the first, each one follows a comma); an
	 * object named twice (duplicate keys: readers keep one or the other) gets them in both */
	for (size_t k = 0, nadd = 0; k < c->nset; k++) {
		const char *key;
		if (c->lost || !c->set[k].add || c->found_in[k] == id || !parent_is(c, k, &key))
			continue;
		edit ed = {.at = members ? last_end : c->i, .set = k, .first = !members && !nadd++};
		ed.end = ed.at;
		if (members) {
			ed.indent = c->s + ind0, ed.nindent = ind1 - ind0;
			ed.colon = c->s + col0, ed.ncolon = col1 - col0;
		}
		c->seen[k]++;
		if (add_edit(c, ed) < 0)
			return -1;
	}
	c->i++; /* '}' */
	return 0;
}

static int value(scan *c, int depth)
{
	if (depth > MAX_NEST)
		return tp_fail(c->e, TP_ELIMIT, "%s: nested deeper than %d", c->fname, MAX_NEST);
	ws(c);
	if (c->i >= c->n)
		return -1;
	char ch = c->s[c->i];
	if (ch == '{')
		return object(c, depth);
	if (ch == '"') {
		skip_string(c);
		return 0;
	}
	if (ch == '[') {
		size_t plen0 = c->plen; /* deeper levels write only past it */
		int lost = plen0 + 3 > MAX_PATH;
		c->lost += lost;
		if (!lost) {
			memcpy(c->path + plen0, "[]", 3); /* elements have no name a set can give */
			c->plen = plen0 + 2;
		}
		c->i++;
		for (;;) {
			ws(c);
			if (c->i >= c->n)
				return -1;
			if (c->s[c->i] == ']')
				break;
			if (c->s[c->i] == ',') {
				c->i++;
				continue;
			}
			if (value(c, depth + 1) < 0)
				return -1;
		}
		c->i++;
		c->lost -= lost;
		c->path[plen0] = 0;
		c->plen = plen0;
		return 0;
	}
	size_t v0 = c->i; /* a number or a literal: up to the next delimiter */
	while (c->i < c->n && (unsigned char)c->s[c->i] > 32 && !strchr(",]}", c->s[c->i]))
		c->i++;
	return c->i > v0 ? 0 : -1;
}

int tp_rank_config(const char *src, size_t len, const tp_cfg_set *set, size_t nset, const char *fname,
		   char **out, size_t *outlen, tp_err *e)
{
	*out = NULL;
	*outlen = 0;
	/* validated as Python reads it, without building a tree (a large config.json costs no second
	 * copy of itself here) */
	size_t first = 0;
	while (first < len && strchr(" \t\r\n", src[first]) && src[first])
		first++;
	if (tp_json_python(fname, src, len, e) < 0)
		return -1;
	if (first >= len || src[first] != '{')
		return tp_fail(e, TP_EINVAL, "%s: not a JSON object", fname);
	scan c = {.s = src, .n = len, .set = set, .nset = nset, .fname = fname, .e = e};
	c.seen = calloc(nset ? nset : 1, sizeof *c.seen);
	c.found_in = calloc(nset ? nset : 1, sizeof *c.found_in);
	if (!c.seen || !c.found_in) {
		free(c.seen);
		free(c.found_in);
		return tp_fail(e, TP_ENOMEM, "out of memory");
	}
	tp_err_clear(e);
	int rc = value(&c, 0);
	if (rc < 0 && (!e || e->code == TP_OK))
		rc = tp_fail(e, TP_EINVAL, "%s: cannot follow the JSON near byte %zu", fname, c.i);
	for (size_t k = 0; k < nset && rc == 0; k++)
		if (!c.seen[k])
			rc = tp_fail(e, TP_EINVAL, "%s: no key \"%s\" to give the rank's value%s", fname, set[k].path,
				     set[k].add ? " (its object is missing)" : "");
	/* write: source pieces between the edits, and each edit's text */
	size_t cap = len + 1, w = 0, from = 0;
	for (size_t k = 0; k < c.ned; k++)
		cap += 64 + 130 + strlen(set[c.ed[k].set].path) + c.ed[k].nindent + c.ed[k].ncolon;
	char *o = rc == 0 ? malloc(cap) : NULL;
	if (rc == 0 && !o)
		rc = tp_fail(e, TP_ENOMEM, "out of memory");
	for (size_t k = 0; k < c.ned && rc == 0; k++) {
		const edit *d = &c.ed[k];
		memcpy(o + w, src + from, d->at - from);
		w += d->at - from;
		if (d->at == d->end) {
			const char *key = strrchr(set[d->set].path, '.');
			key = key ? key + 1 : set[d->set].path;
			if (!d->first) {
				o[w++] = ',';
				if (d->nindent) /* none after a key added to an empty object */
					memcpy(o + w, d->indent, d->nindent);
				w += d->nindent;
			}
			w += (size_t)snprintf(o + w, cap - w, "\"%s\"", key);
			if (d->ncolon) {
				memcpy(o + w, d->colon, d->ncolon);
				w += d->ncolon;
			} else {
				w += (size_t)snprintf(o + w, cap - w, ": ");
			}
		}
		if (set[d->set].null)
			w += (size_t)snprintf(o + w, cap - w, "null");
		else if (set[d->set].str)
			w += (size_t)snprintf(o + w, cap - w, "\"%.128s\"", set[d->set].str);
		else
			w += (size_t)snprintf(o + w, cap - w, "%lld", (long long)set[d->set].value);
		from = d->end;
	}
	if (rc == 0) {
		memcpy(o + w, src + from, len - from);
		w += len - from;
		o[w] = 0;
		*out = o;
		*outlen = w;
	}
	free(c.ed);
	free(c.seen);
	free(c.found_in);
	return rc;
}
