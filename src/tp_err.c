/* tp_err.c: formatting of core errors (see tp_err.h). */
#include "tp_err.h"

#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int tp_fail(tp_err *e, tp_code code, const char *fmt, ...)
{
	if (e) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(e->msg, sizeof e->msg, fmt, ap);
		va_end(ap);
		e->code = code;
	}
	return -1;
}

void tp_err_prefix(tp_err *e, const char *fmt, ...)
{
	if (!e)
		return;
	char pre[TP_ERR_MSG], old[TP_ERR_MSG];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(pre, sizeof pre, fmt, ap);
	va_end(ap);
	memcpy(old, e->msg, sizeof old);
	tp_fmt(e->msg, sizeof e->msg, "%s: %s", pre, old);
}

void tp_logf(tp_log_fn log, void *ctx, int level, const char *fmt, ...)
{
	if (!log)
		return;
	char msg[TP_ERR_MSG];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	log(ctx, level, msg);
}

void tp_err_clear(tp_err *e)
{
	if (e) {
		e->code = TP_OK;
		e->msg[0] = '\0';
	}
}

void tp_fmt(char *dst, size_t cap, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(dst, cap, fmt, ap);
	va_end(ap);
}

int tp_json_fail(tp_err *e, const char *what, const char *text, size_t len, const char *at)
{
	size_t depth = 0, max = 0;
	int str = 0;
	for (size_t i = 0; i < len; i++) { /* nesting outside strings */
		char c = text[i];
		if (str) {
			if (c == '\\')
				i++;
			else if (c == '"')
				str = 0;
		} else if (c == '"') {
			str = 1;
		} else if (c == '{' || c == '[') {
			if (++depth > max)
				max = depth;
		} else if ((c == '}' || c == ']') && depth) {
			depth--;
		}
	}
	if (max > CJSON_NESTING_LIMIT)
		return tp_fail(e, TP_EINVAL, "%s: JSON nested deeper than %d levels (the JSON parser's limit)", what,
			       CJSON_NESTING_LIMIT);
	long pos = at && at >= text && at <= text + len ? (long)(at - text) : 0;
	return tp_fail(e, TP_EINVAL, "%s: not valid JSON (near byte %ld)", what, pos);
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

int tp_json_unique(tp_err *e, const char *what, const cJSON *j)
{
	size_t n = 0;
	const cJSON *c;
	for (c = j ? j->child : NULL; c; c = c->next)
		n++;
	if (cJSON_IsObject(j) && n > 1) {
		const char **k = malloc(n * sizeof *k);
		if (!k)
			return tp_fail(e, TP_ENOMEM, "%s: out of memory", what);
		n = 0;
		for (c = j->child; c; c = c->next)
			k[n++] = c->string ? c->string : "";
		qsort(k, n, sizeof *k, cmp_str);
		for (size_t i = 1; i < n; i++)
			if (!strcmp(k[i - 1], k[i])) {
				tp_fail(e, TP_EINVAL, "%s: key \"%.200s\" appears twice in one object (JSON readers "
					"differ on which one counts)", what, k[i]);
				free(k);
				return -1;
			}
		free(k);
	}
	for (c = j ? j->child : NULL; c; c = c->next)
		if (tp_json_unique(e, what, c) < 0)
			return -1;
	return 0;
}
