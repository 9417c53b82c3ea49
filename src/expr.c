/* expr.c: a recursive-descent evaluator for plan expressions (see expr.h). Expressions are
 * short and evaluated at mount time only, so they are parsed and evaluated in one pass.
 *
 * The untaken side of `&&`, `||` and `?:`, the arguments of first() after its first present one and
 * the index of a missing list are parsed but not evaluated: while P.skip is non-zero
 * no key is looked up, no arithmetic is done and no value error is raised (syntax errors, unknown
 * functions and the depth limit still are). Every recursion (a nested expression in parentheses,
 * an argument, an index, a branch of ?:, a unary operator) passes through expr() or unary(), which
 * count it against TP_EXPR_MAX_DEPTH, so no input can exhaust the stack. Arithmetic is checked:
 * overflow (INT64_MIN / -1 and % -1 included), division by zero, inexact division and integer
 * literals that do not fit in 64 bits are errors. Every error is TP_ERULE. */
#include "expr.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum { V_INT, V_STR, V_LIST, V_MISSING, V_OBJ } vkind; /* V_OBJ: an object or a non-integer number,
                                                                 * for has() only */

typedef struct val {
	vkind k;
	int64_t i;
	const char *s;          /* V_STR: points into the source or the config (not owned) */
	size_t slen;
	const cJSON *list;      /* V_LIST */
	char name[96];          /* the key a missing value came from, for messages */
	int number;             /* V_OBJ: a number that is not an integer (layernorm_epsilon), not an object */
} val;

typedef struct P {
	tp_expr_ctx *c;
	const char *src, *p;
	tp_err *e;
	int err;
	int depth;
	int skip;               /* > 0: inside an untaken branch: parse only */
	int guard;              /* > 0: inside the arguments of has() or first(), which test missing */
} P;

static int perr(P *p, const char *fmt, const char *arg)
{
	if (!p->err) {
		char m[512];
		tp_fmt(m, sizeof m, fmt, arg);
		size_t n = strlen(p->src);
		/* a long expression is quoted by its start: the reason must fit in the message */
		tp_fail(p->e, TP_ERULE, "expression '%.*s%s': %s", n > 200 ? 200 : (int)n, p->src, n > 200 ? "..." : "", m);
	}
	p->err = 1;
	return -1;
}

static void skip(P *p)
{
	while (isspace((unsigned char)*p->p))
		p->p++;
}

static int accept(P *p, const char *tok)
{
	skip(p);
	size_t n = strlen(tok);
	if (strncmp(p->p, tok, n) == 0) {
		/* do not take '=' of '==' as '=', nor '<' of '<=' */
		if ((n == 1 && (tok[0] == '<' || tok[0] == '>' || tok[0] == '!') && p->p[1] == '=') ||
		    (n == 1 && (tok[0] == '&' || tok[0] == '|') && p->p[1] == tok[0]))
			return 0;
		p->p += n;
		return 1;
	}
	return 0;
}

/* Counts one level of recursion; every recursive path passes here (expr and unary). */
static int enter(P *p)
{
	if (++p->depth > TP_EXPR_MAX_DEPTH)
		return perr(p, "nested more than %s levels deep", TP_EXPR_MAX_DEPTH_S);
	return 0;
}

static int need_int(P *p, const val *v, const char *what)
{
	if (v->k == V_INT || p->skip)
		return 0;
	if (v->k == V_MISSING)
		return perr(p, "key '%s' is missing from config.json", v->name);
	return perr(p, "%s is not an integer", what);
}

/* Copies src into dst[cap] (truncated, NUL-terminated): tp_fmt's "%s" without printf's cost,
 * which was a tenth of planning a 200k-tensor checkpoint. */
static void cpy(char *dst, size_t cap, const char *src)
{
	size_t l = strnlen(src, cap - 1);
	memcpy(dst, src, l);
	dst[l] = 0;
}

/* Notes that the evaluation read key (value n), for tp_expr_used: formatting it here, for every
 * expression of every tensor, cost more than the rest of the evaluation. */
static void note_used(tp_expr_ctx *c, const char *key, const cJSON *n)
{
	for (int i = 0; i < c->nused; i++)
		if (strcmp(c->usedk[i].key, key) == 0)
			return;
	if (c->nused == (int)(sizeof c->usedk / sizeof *c->usedk))
		return;
	cpy(c->usedk[c->nused].key, sizeof c->usedk[0].key, key);
	c->usedk[c->nused++].node = n;
}

/* Writes a short text of a scalar config value n into v[cap] (cap >= 48): a number as JSON writes
 * it, true / false / null, a string quoted (its first 40 characters, then "..."); 0, or -1 when n
 * is not a scalar. */
static int scalar_text(const cJSON *n, char *v, size_t cap)
{
	if (cJSON_IsNumber(n))
		tp_fmt(v, cap, "%.17g", n->valuedouble);
	else if (cJSON_IsBool(n))
		tp_fmt(v, cap, "%s", cJSON_IsTrue(n) ? "true" : "false");
	else if (cJSON_IsNull(n))
		tp_fmt(v, cap, "null");
	else if (cJSON_IsString(n))
		tp_fmt(v, cap, "'%.40s%s'", n->valuestring, strlen(n->valuestring) > 40 ? "..." : "");
	else
		return -1;
	return 0;
}

/* Writes the text of config value n into v[cap] (cap >= 48): a scalar as scalar_text; a list as
 * its elements while they fit in about 40 characters, then "..." and the count ([1, 3] or
 * ['linear_attention', ... 48 entries]); an object as {...}. */
static void value_text(const cJSON *n, char *v, size_t cap)
{
	if (scalar_text(n, v, cap) == 0)
		return;
	if (!cJSON_IsArray(n)) {
		tp_fmt(v, cap, "{...}");
		return;
	}
	int count = cJSON_GetArraySize(n);
	size_t w = 0;
	const cJSON *it;
	int k = 0;
	v[w++] = '[';
	cJSON_ArrayForEach(it, n)
	{
		char one[64];
		if (scalar_text(it, one, sizeof one) < 0)
			tp_fmt(one, sizeof one, "%s", cJSON_IsArray(it) ? "[...]" : "{...}");
		size_t ol = strlen(one);
		if (w + ol + 24 > cap || w + ol > 48) {
			tp_fmt(v + w, cap - w, "%s... %d entries]", k ? ", " : "", count);
			return;
		}
		tp_fmt(v + w, cap - w, "%s%s", k ? ", " : "", one);
		w += strlen(v + w);
		k++;
	}
	tp_fmt(v + w, cap - w, "]");
}

const char *tp_expr_used(tp_expr_ctx *c)
{
	c->used[0] = 0;
	for (int i = 0; i < c->nused; i++) {
		size_t l = strlen(c->used);
		if (l > sizeof c->used - 40)
			break;
		char v[128];
		value_text(c->usedk[i].node, v, sizeof v);
		tp_fmt(c->used + l, sizeof c->used - l, "%s%s=%s", l ? ", " : "", c->usedk[i].key, v);
	}
	return c->used;
}

const cJSON *tp_config_get(const tp_expr_ctx *c, const char *key)
{
	for (int pi = 0; c->config && pi <= c->nprefix; pi++) {
		const cJSON *n = c->config;
		if (pi < c->nprefix) {
			n = cJSON_GetObjectItemCaseSensitive(n, c->prefix[pi]);
			if (!cJSON_IsObject(n))
				continue;
		}
		const char *k = key;
		while (n && *k) {
			const char *dot = strchr(k, '.');
			size_t l = dot ? (size_t)(dot - k) : strlen(k);
			char part[96];
			if (l >= sizeof part)
				return NULL;
			memcpy(part, k, l);
			part[l] = 0;
			n = cJSON_IsObject(n) ? cJSON_GetObjectItemCaseSensitive(n, part) : NULL;
			k += l + (dot ? 1 : 0);
		}
		if (n && !cJSON_IsNull(n))
			return n;
	}
	if (c->defaults) {
		tp_expr_ctx d = {.config = c->defaults};
		return tp_config_get(&d, key);
	}
	return NULL;
}

static int from_json(P *p, const cJSON *n, const char *name, val *out)
{
	memset(out, 0, sizeof *out);
	cpy(out->name, sizeof out->name, name);
	if (!n || cJSON_IsNull(n)) {
		out->k = V_MISSING;
	} else if (cJSON_IsBool(n)) {
		out->k = V_INT;
		out->i = cJSON_IsTrue(n);
	} else if (cJSON_IsNumber(n)) {
		double d = n->valuedouble;
		/* the range first: converting a double outside int64 is undefined */
		if (!(d <= 9007199254740992.0 && d >= -9007199254740992.0) || d != (double)(int64_t)d) {
			if (!p->guard)
				return perr(p, "config value '%s' is not an integer", name);
			out->k = V_OBJ; /* has(layernorm_epsilon): present; call() refuses other uses */
			out->number = 1;
			return 0;
		}
		out->k = V_INT;
		out->i = (int64_t)d;
	} else if (cJSON_IsString(n)) {
		out->k = V_STR;
		out->s = n->valuestring;
		out->slen = strlen(n->valuestring);
	} else if (cJSON_IsArray(n)) {
		out->k = V_LIST;
		out->list = n;
	} else if (p->guard) { /* has(quantization_config.kv_cache_scheme): present; call() refuses other uses */
		out->k = V_OBJ;
	} else {
		return perr(p, "config value '%s' is an object, not a value", name);
	}
	return 0;
}

static int expr(P *p, val *out);

static int call(P *p, const char *fn, val *out)
{
	val a[8];
	int n = 0, guarded = !strcmp(fn, "has") || !strcmp(fn, "first");
	int lazy = !strcmp(fn, "first"), found = 0; /* first(): the arguments after the first present one
	                                               * are parsed, not evaluated (as the untaken side of &&) */
	skip(p);
	if (!accept(p, ")")) {
		p->guard += guarded;
		do {
			if (n == 8)
				return perr(p, "too many arguments to %s()", fn);
			p->skip += found;
			int rc = expr(p, &a[n]);
			p->skip -= found;
			if (rc < 0)
				return -1;
			found |= lazy && !p->skip && a[n].k != V_MISSING;
			n++;
		} while (accept(p, ","));
		p->guard -= guarded;
		if (!accept(p, ")"))
			return perr(p, "expected ')' after the arguments of %s()", fn);
	}
	memset(out, 0, sizeof *out);
	out->k = V_INT;
	static const struct {
		const char *name;
		int min, max;
	} fns[] = {{"has", 1, 1}, {"first", 1, 8}, {"cdiv", 2, 2}, {"min", 2, 2}, {"max", 2, 2},
		   {"len", 1, 1}, {"in", 2, 2}, {"tensor", 1, 1}};
	int known = 0;
	for (size_t i = 0; i < sizeof fns / sizeof fns[0]; i++)
		known |= strcmp(fn, fns[i].name) == 0 && n >= fns[i].min && n <= fns[i].max;
	if (!known)
		return perr(p, "unknown function or wrong number of arguments: %s()", fn);
	if (p->skip)
		return 0; /* parsed, not evaluated */
	for (int i = 0; i < n; i++)
		if (a[i].k == V_OBJ && strcmp(fn, "has") != 0)
			return perr(p, a[i].number ? "config value '%s' is not an integer (only has() takes one)"
					: "config value '%s' is an object, not a value (only has() takes one)", a[i].name);
	if (strcmp(fn, "has") == 0 && n == 1) {
		out->i = a[0].k != V_MISSING;
	} else if (strcmp(fn, "first") == 0 && n >= 1) {
		*out = a[n - 1]; /* all missing: the last, which names its key */
		for (int i = 0; i < n; i++)
			if (a[i].k != V_MISSING) {
				*out = a[i]; /* the one present argument evaluated: those after it were skipped */
				break;
			}
	} else if ((strcmp(fn, "cdiv") == 0 || strcmp(fn, "min") == 0 || strcmp(fn, "max") == 0) && n == 2) {
		if (need_int(p, &a[0], "an argument") < 0 || need_int(p, &a[1], "an argument") < 0)
			return -1;
		if (fn[0] == 'c') {
			if (a[1].i <= 0)
				return perr(p, "%s: division by a non-positive number", fn);
			int64_t s;
			if (__builtin_add_overflow(a[0].i, a[1].i - 1, &s))
				return perr(p, "%s: overflows", fn);
			out->i = s / a[1].i;
		} else if (fn[1] == 'i') {
			out->i = a[0].i < a[1].i ? a[0].i : a[1].i;
		} else {
			out->i = a[0].i > a[1].i ? a[0].i : a[1].i;
		}
	} else if (strcmp(fn, "len") == 0 && n == 1) {
		if (a[0].k == V_MISSING)
			return perr(p, "key '%s' is missing from config.json", a[0].name);
		if (a[0].k != V_LIST)
			return perr(p, "%s: argument is not a list", fn);
		out->i = cJSON_GetArraySize(a[0].list);
	} else if (strcmp(fn, "tensor") == 0 && n == 1) { /* a view entry's "if": the source holds that tensor */
		if (a[0].k != V_STR)
			return perr(p, "%s: expects a 'tensor name' (a template of the entry's variables)", fn);
		if (!p->c->tensor)
			return perr(p, "%s() reads the checkpoint's tensors: only a view entry's \"if\" may use it", fn);
		char nm[1024];
		if (a[0].slen >= sizeof nm)
			return perr(p, "%s: the name is too long", fn);
		memcpy(nm, a[0].s, a[0].slen);
		nm[a[0].slen] = 0;
		int hit = p->c->tensor(p->c->tensor_arg, nm);
		if (hit < 0)
			return perr(p, "tensor('%s'): the name uses a variable the entry's first piece does not bind", nm);
		out->i = hit;
	} else if (strcmp(fn, "in") == 0 && n == 2) {
		if (a[1].k == V_MISSING) {
			out->i = 0;
			return 0;
		}
		if (a[1].k != V_LIST || need_int(p, &a[0], "the first argument of in()") < 0)
			return perr(p, "%s: expects (integer, list)", fn);
		const cJSON *it;
		out->i = 0;
		cJSON_ArrayForEach(it, a[1].list) if (cJSON_IsNumber(it) && it->valuedouble == (double)a[0].i) out->i = 1;
	} else {
		return perr(p, "unknown function or wrong number of arguments: %s()", fn);
	}
	return 0;
}

static int primary(P *p, val *out)
{
	skip(p);
	memset(out, 0, sizeof *out);
	const char *s = p->p;
	if (isdigit((unsigned char)*s)) {
		char *end;
		errno = 0;
		long long v = strtoll(s, &end, 10);
		if (errno == ERANGE) {
			char lit[32];
			tp_fmt(lit, sizeof lit, "%.*s%s", (int)(end - s > 24 ? 24 : end - s), s, end - s > 24 ? "..." : "");
			return perr(p, "the literal %s does not fit in a signed 64-bit integer", lit);
		}
		p->p = end;
		out->k = V_INT;
		out->i = v;
		return 0;
	}
	if (*s == '\'' || *s == '"') {
		const char *q = strchr(s + 1, *s);
		if (!q)
			return perr(p, "%s", "unterminated string");
		out->k = V_STR;
		out->s = s + 1;
		out->slen = (size_t)(q - s - 1);
		p->p = q + 1;
		return 0;
	}
	if (accept(p, "(")) {
		if (expr(p, out) < 0)
			return -1;
		if (!accept(p, ")"))
			return perr(p, "%s", "expected ')'");
		return 0;
	}
	if (isalpha((unsigned char)*s) || *s == '_') {
		const char *q = s;
		while (isalnum((unsigned char)*q) || *q == '_' || (*q == '.' && (isalpha((unsigned char)q[1]) || q[1] == '_')))
			q++;
		char name[96];
		size_t l = (size_t)(q - s);
		if (l >= sizeof name)
			return perr(p, "%s", "identifier too long");
		memcpy(name, s, l);
		name[l] = 0;
		p->p = q;
		if (accept(p, "("))
			return call(p, name, out);
		if (strcmp(name, "true") == 0 || strcmp(name, "false") == 0) {
			out->k = V_INT;
			out->i = name[0] == 't';
			return 0;
		}
		if (p->skip) { /* not evaluated: no lookup, nothing noted as used */
			out->k = V_MISSING;
			cpy(out->name, sizeof out->name, name);
			return 0;
		}
		for (int i = 0; i < p->c->nvar; i++) {
			if (strcmp(p->c->var[i], name) == 0) {
				out->k = V_INT;
				out->i = p->c->val[i];
				return 0;
			}
		}
		const cJSON *n = tp_config_get(p->c, name);
		if (n)
			note_used(p->c, name, n);
		else if (!p->guard && !p->c->missing[0])
			cpy(p->c->missing, sizeof p->c->missing, name);
		return from_json(p, n, name, out);
	}
	return perr(p, "unexpected text at '%s'", *s ? s : "(end)");
}

static int postfix(P *p, val *out)
{
	if (primary(p, out) < 0)
		return -1;
	while (accept(p, "[")) {
		val idx;
		int absent = out->k == V_MISSING; /* missing[i] stays missing: i is parsed, not evaluated,
		                                   * so has(x[i]) reads only x when x is missing */
		p->skip += absent;
		int rc = expr(p, &idx) < 0 || need_int(p, &idx, "an index") < 0 ? -1 : 0;
		p->skip -= absent;
		if (rc < 0)
			return -1;
		if (!accept(p, "]"))
			return perr(p, "%s", "expected ']'");
		if (absent || p->skip)
			continue;
		if (out->k != V_LIST)
			return perr(p, "%s", "indexing something that is not a list");
		char nm[96];
		tp_fmt(nm, sizeof nm, "%s[%lld]", out->name, (long long)idx.i);
		int size = cJSON_GetArraySize(out->list);
		if (idx.i < 0 || idx.i >= size) {
			/* outside the list: an error, as using a missing key is, unless has() or first() asks
			 * (has(layer_types[i]), first(layer_types[i], 'full_attention') for an MTP layer past
			 * layer_types): there it is missing */
			if (!p->guard) {
				char m[256];
				tp_fmt(m, sizeof m, "index %lld is %s '%.95s' (%d entries): has(%.95s) tests for it, "
				       "first(%.95s, default) gives a default", (long long)idx.i,
				       idx.i < 0 ? "negative, in" : "past the end of", out->name, size, nm, nm);
				return perr(p, "%s", m);
			}
			memset(out, 0, sizeof *out);
			out->k = V_MISSING;
			cpy(out->name, sizeof out->name, nm);
			continue;
		}
		if (from_json(p, cJSON_GetArrayItem(out->list, (int)idx.i), nm, out) < 0)
			return -1;
	}
	return 0;
}

static int unary(P *p, val *out)
{
	if (enter(p) < 0)
		return -1;
	int rc;
	if (accept(p, "!")) {
		rc = unary(p, out);
		if (rc == 0) {
			int truth = out->k == V_INT ? out->i != 0 : out->k == V_MISSING ? 0 : 1;
			out->k = V_INT;
			out->i = !truth;
		}
	} else if (accept(p, "-")) {
		rc = unary(p, out);
		if (rc == 0 && need_int(p, out, "the operand of '-'") < 0)
			rc = -1;
		if (rc == 0 && p->skip) {
			out->k = V_INT;
			out->i = 0;
		} else if (rc == 0 && __builtin_sub_overflow((int64_t)0, out->i, &out->i)) {
			rc = perr(p, "%s", "negation overflows");
		}
	} else {
		rc = postfix(p, out);
	}
	p->depth--;
	return rc;
}

static int mul(P *p, val *out)
{
	if (unary(p, out) < 0)
		return -1;
	for (;;) {
		char op = accept(p, "*") ? '*' : accept(p, "/") ? '/' : accept(p, "%") ? '%' : 0;
		if (!op)
			return 0;
		val b;
		if (unary(p, &b) < 0 || need_int(p, out, "the left operand") < 0 || need_int(p, &b, "the right operand") < 0)
			return -1;
		if (p->skip) {
			out->k = V_INT;
			out->i = 0;
			continue;
		}
		if (op == '*') {
			if (__builtin_mul_overflow(out->i, b.i, &out->i))
				return perr(p, "%s", "multiplication overflows");
		} else {
			if (b.i == 0)
				return perr(p, "%s", "division by zero");
			if (b.i == -1 && out->i == INT64_MIN)
				return perr(p, "%s", op == '/' ? "division overflows" : "remainder overflows");
			if (op == '/' && out->i % b.i) {
				char m[96];
				tp_fmt(m, sizeof m, "%lld / %lld is not exact", (long long)out->i, (long long)b.i);
				return perr(p, "%s", m);
			}
			out->i = op == '/' ? out->i / b.i : out->i % b.i;
		}
	}
}

static int add(P *p, val *out)
{
	if (mul(p, out) < 0)
		return -1;
	for (;;) {
		char op = accept(p, "+") ? '+' : accept(p, "-") ? '-' : 0;
		if (!op)
			return 0;
		val b;
		if (mul(p, &b) < 0 || need_int(p, out, "the left operand") < 0 || need_int(p, &b, "the right operand") < 0)
			return -1;
		if (p->skip) {
			out->k = V_INT;
			out->i = 0;
			continue;
		}
		if (op == '+' ? __builtin_add_overflow(out->i, b.i, &out->i) : __builtin_sub_overflow(out->i, b.i, &out->i))
			return perr(p, "%s", "addition overflows");
	}
}

static int cmp(P *p, val *out)
{
	if (add(p, out) < 0)
		return -1;
	static const char *ops[] = {"==", "!=", "<=", ">=", "<", ">"};
	for (int k = 0; k < 6; k++) {
		if (!accept(p, ops[k]))
			continue;
		val b;
		if (add(p, &b) < 0)
			return -1;
		int r = 0;
		if (p->skip) {
			/* not evaluated */
		} else if (out->k == V_STR && b.k == V_STR && k < 2) {
			r = out->slen == b.slen && memcmp(out->s, b.s, b.slen) == 0;
			r = k == 0 ? r : !r;
		} else if ((out->k == V_MISSING || b.k == V_MISSING) && k < 2) {
			r = (out->k == b.k) == (k == 0); /* missing equals only missing */
		} else {
			if (need_int(p, out, "the left operand") < 0 || need_int(p, &b, "the right operand") < 0)
				return -1;
			int64_t x = out->i, y = b.i;
			r = k == 0 ? x == y : k == 1 ? x != y : k == 2 ? x <= y : k == 3 ? x >= y : k == 4 ? x < y : x > y;
		}
		memset(out, 0, sizeof *out);
		out->k = V_INT;
		out->i = r;
		return 0;
	}
	return 0;
}

static int truth(const val *v)
{
	return v->k == V_INT ? v->i != 0 : v->k == V_MISSING ? 0 : 1;
}

/* Parses the right operand of && or ||; evaluates it only when `taken`. */
static int branch(P *p, int taken, int (*parse)(P *, val *), val *out)
{
	p->skip += !taken;
	int rc = parse(p, out);
	p->skip -= !taken;
	return rc;
}

static int logic_and(P *p, val *out)
{
	if (cmp(p, out) < 0)
		return -1;
	while (accept(p, "&&")) {
		val b;
		int t = truth(out);
		if (branch(p, t, cmp, &b) < 0)
			return -1;
		int r = t && truth(&b);
		memset(out, 0, sizeof *out);
		out->i = r;
	}
	return 0;
}

static int logic_or(P *p, val *out)
{
	if (logic_and(p, out) < 0)
		return -1;
	while (accept(p, "||")) {
		val b;
		int t = truth(out);
		if (branch(p, !t, logic_and, &b) < 0)
			return -1;
		int r = t || truth(&b);
		memset(out, 0, sizeof *out);
		out->i = r;
	}
	return 0;
}

static int expr(P *p, val *out)
{
	if (enter(p) < 0)
		return -1;
	int rc = logic_or(p, out);
	if (rc == 0 && accept(p, "?")) {
		val a, b;
		int t = truth(out);
		if (branch(p, t, expr, &a) < 0 || (!accept(p, ":") && perr(p, "%s", "expected ':' in a ?: expression")) ||
		    branch(p, !t, expr, &b) < 0)
			rc = -1;
		else
			*out = t ? a : b;
	}
	p->depth--;
	return rc;
}

static int eval(tp_expr_ctx *c, const char *src, val *out, tp_err *e)
{
	P p = {.c = c, .src = src, .p = src, .e = e};
	c->nused = 0;
	c->used[0] = 0;
	c->missing[0] = 0;
	if (expr(&p, out) < 0)
		return -1;
	skip(&p);
	if (*p.p)
		return perr(&p, "unexpected text at '%s'", p.p);
	return 0;
}

int tp_expr_check(const char *src, tp_err *e)
{
	tp_expr_ctx c = {0};
	P p = {.c = &c, .src = src, .p = src, .e = e, .skip = 1};
	val v;
	if (expr(&p, &v) < 0)
		return -1;
	skip(&p);
	if (*p.p)
		return perr(&p, "unexpected text at '%s'", p.p);
	return 0;
}

int tp_expr_int(tp_expr_ctx *c, const char *src, int64_t *out, tp_err *e)
{
	val v;
	if (eval(c, src, &v, e) < 0)
		return -1;
	if (v.k == V_MISSING) {
		tp_fail(e, TP_ERULE, "expression '%.200s%s': key '%s' is missing from config.json", src,
			strlen(src) > 200 ? "..." : "", v.name);
		return 1;
	}
	if (v.k != V_INT)
		return tp_fail(e, TP_ERULE, "expression '%.200s%s' is not an integer", src, strlen(src) > 200 ? "..." : "");
	*out = v.i;
	return 0;
}

int tp_expr_cond(tp_expr_ctx *c, const char *src, tp_err *e)
{
	val v;
	if (eval(c, src, &v, e) < 0)
		return -1;
	return truth(&v);
}

void tp_expr_bind(tp_expr_ctx *c, const char *name, int64_t v)
{
	for (int i = 0; i < c->nvar; i++) {
		if (strcmp(c->var[i], name) == 0) {
			c->val[i] = v;
			return;
		}
	}
	if (c->nvar < TP_EXPR_MAX_VARS) {
		tp_fmt(c->var[c->nvar], sizeof c->var[0], "%s", name);
		c->val[c->nvar++] = v;
	}
}
