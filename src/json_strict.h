/* json_strict: JSON accepted exactly where Python's json accepts it.
 *
 * tpfs plans from config.json, index files and plan files with cJSON, while the loaders that read
 * the mount use Python's json (transformers opens config.json as UTF-8 and calls json.load). The
 * two disagree; where cJSON accepts what Python refuses, tpfs would mount, plan from part of a
 * file, and serve rank configs no loader can read. The disagreements, each refused here with
 * Python's own words and the line and column:
 *   - data after the top-level value ("Extra data"): cJSON stops after the first value;
 *   - whitespace other than space, tab, newline and carriage return (cJSON skips every byte up
 *     to 0x20, form feed and NUL included): "Expecting value";
 *   - raw control characters (below 0x20) inside strings ("Invalid control character");
 *   - numbers outside JSON's grammar: a leading '+', leading zeros, "1.", ".5", "1e"
 *     (cJSON reads them with strtod);
 *   - invalid UTF-8 (Python decodes the file first: UnicodeDecodeError), and a byte-order mark
 *     ("Unexpected UTF-8 BOM");
 *   - escapes cJSON reads otherwise: \u0000 (cJSON cuts the string there) and unpaired surrogates
 *     (cJSON drops or mangles them), refused although Python reads them;
 *   - NaN, Infinity and -Infinity, which Python reads and cJSON does not (refused, saying so);
 *   - nesting deeper than TP_JSON_MAX_DEPTH (both parsers have limits near 1000, not the same).
 * Duplicate keys are the other disagreement (Python keeps the last, cJSON the first):
 * tp_json_unique (tp_err.h) refuses them after parsing.
 */
#ifndef TP_JSON_STRICT_H
#define TP_JSON_STRICT_H

#include <stddef.h>

#include "tp_err.h"

#define TP_JSON_MAX_DEPTH 200

/* Checks that text[0..len) is one JSON value, as Python's json.loads(text.decode("utf-8"))
 * reads it, with none of the constructs above. Returns 0, or -1 with "<what>: line L column C:
 * <Python's message> ..." in e (TP_EINVAL). */
int tp_json_python(const char *what, const char *text, size_t len, tp_err *e);

/* tp_json_python, then cJSON's parse and tp_json_unique: the parsed value (the caller deletes
 * it), or NULL with e set. */
struct cJSON *tp_json_parse(const char *what, const char *text, size_t len, tp_err *e);

#endif
