/* tp_err.c: formatting of core errors (see tp_err.h). */
#include "tp_err.h"

#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdio.h>
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
