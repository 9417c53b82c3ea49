/* tp_err.h: the error type of the tpfs core.
 *
 * Every function of the core (format, spec, layout, map, gather, plan, model) reports failure
 * through a tp_err: a category code and a message that names the file, the tensor and the
 * rule that failed. Only the filesystem layer (fs.c) turns a category into an errno, and only
 * the CLI turns a message into an exit status. The core never prints.
 */
#ifndef TP_ERR_H
#define TP_ERR_H

#include <stddef.h>

typedef enum tp_code {
	TP_OK = 0,
	TP_EINVAL,   /* the input breaks a rule of the format, the plan or the config */
	TP_ENOMEM,   /* an allocation failed */
	TP_EIO,      /* a system call on a source file failed */
	TP_ECHANGED, /* a source file changed (size, mtime, inode) since it was planned */
	TP_ELIMIT,   /* a named tpfs limit was exceeded (tensors per file, dims, T, ...) */
	TP_EPLAN,    /* a plan cannot be served (indivisible split, cut inside a block, ...) */
	TP_ERULE,    /* a rule of the plan file cannot be evaluated: an expression is malformed,
	              * overflows, or names a key config.json lacks (the plan or config is wrong,
	              * not the tensor) */
} tp_code;

#define TP_ERR_MSG 1024

typedef struct tp_err {
	tp_code code;
	char msg[TP_ERR_MSG]; /* NUL-terminated, one line, no trailing newline */
} tp_err;

/* Records an error in e (e may be NULL) and returns -1, so callers can write
 * `return tp_fail(e, TP_EINVAL, "...", ...);`. The message is truncated to fit. */
int tp_fail(tp_err *e, tp_code code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Prepends "<prefix>: " to the message already in e (no-op when e is NULL). Used by callers
 * that know the file name when the callee did not. */
void tp_err_prefix(tp_err *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* snprintf that truncates silently (for building message contexts). */
void tp_fmt(char *dst, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Records why cJSON refused text[0..len) (at: cJSON_GetErrorPtr()) as "<what>: not valid JSON
 * (near byte N)", or, when the text nests deeper than cJSON's limit, says so and names the limit.
 * Returns -1. */
struct cJSON;

int tp_json_fail(tp_err *e, const char *what, const char *text, size_t len, const char *at);

/* Checks that no object in j (at any depth) names a key twice: Python's json keeps the last of
 * duplicate keys and cJSON the first, so tpfs and a loader would read different values. Returns 0,
 * or -1 with "<what>: key "K" appears twice in one object ..." in e. */
int tp_json_unique(tp_err *e, const char *what, const struct cJSON *j);

/* Where the core hands warnings and notes it does not fail on (the CLI prints them): level 0
 * warn, 1 info, 2 error. The core never prints; a module that warns takes one of these and its
 * ctx as arguments. */
typedef void (*tp_log_fn)(void *ctx, int level, const char *msg);

/* Formats a message (truncated to TP_ERR_MSG) and hands it to log(ctx, level, ...); nothing
 * when log is NULL. */
void tp_logf(tp_log_fn log, void *ctx, int level, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* Clears e to TP_OK with an empty message. */
void tp_err_clear(tp_err *e);

/* Overflow-checked unsigned 64-bit arithmetic: return 0 on success, -1 on overflow. */
static inline int tp_mul64(unsigned long long a, unsigned long long b, unsigned long long *out)
{
	return __builtin_mul_overflow(a, b, out) ? -1 : 0;
}
static inline int tp_add64(unsigned long long a, unsigned long long b, unsigned long long *out)
{
	return __builtin_add_overflow(a, b, out) ? -1 : 0;
}

#endif
