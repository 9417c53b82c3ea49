/* view.c: engine view files parsed and chosen (see view.h); view_resolve.c resolves them. */
#include "view.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "expr.h"
#include "json_strict.h"

/* ---- parsing ---- */

static const char *str_of(const cJSON *o, const char *k)
{
	const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, k);
	return cJSON_IsString(x) ? x->valuestring : NULL;
}

/* A template: literal text and {var} (letters, digits, _), no two variables side by side. */
/* The distinct template variables of one entry: at most TP_VIEW_VARS, each under 32 characters
 * (what view_resolve.c binds; a template past either limit would never match, so it is refused). */
typedef struct tvars {
	char name[TP_VIEW_VARS][32];
	int n;
} tvars;

static int check_template(const char *t, const char *origin, size_t k, tvars *vs, int wild, tp_err *e)
{
	int prev_var = 0;
	for (const char *c = t; *c;) {
		if (*c == '*' && (!wild || c[1]))
			return tp_fail(e, TP_EINVAL, "%s: tensors[%zu]: template '%s': '*' (any rest of the name) ends a drop "
				       "template only", origin, k, t);
		if (*c == '{') {
			const char *end = strchr(c, '}');
			if (!end || end == c + 1 || prev_var)
				return tp_fail(e, TP_EINVAL, "%s: tensors[%zu]: template '%s': a variable is {name}, and two "
					       "cannot stand side by side", origin, k, t);
			for (const char *q = c + 1; q < end; q++)
				if (!((*q >= 'a' && *q <= 'z') || (*q >= 'A' && *q <= 'Z') || (*q >= '0' && *q <= '9') || *q == '_'))
					return tp_fail(e, TP_EINVAL, "%s: tensors[%zu]: template '%s': bad variable name", origin, k, t);
			size_t nl = (size_t)(end - c - 1);
			if (nl >= sizeof vs->name[0])
				return tp_fail(e, TP_EINVAL, "%s: tensors[%zu]: template '%s': a variable name is at most %zu "
					       "characters", origin, k, t, sizeof vs->name[0] - 1);
			int seen = 0;
			for (int j = 0; j < vs->n && !seen; j++)
				seen = strlen(vs->name[j]) == nl && !strncmp(vs->name[j], c + 1, nl);
			if (!seen) {
				if (vs->n == TP_VIEW_VARS)
					return tp_fail(e, TP_EINVAL, "%s: tensors[%zu]: template '%s': an entry has at most %d "
						       "variables", origin, k, t, TP_VIEW_VARS);
				memcpy(vs->name[vs->n], c + 1, nl);
				vs->name[vs->n++][nl] = 0;
			}
			c = end + 1;
			prev_var = 1;
		} else {
			if (*c == '}')
				return tp_fail(e, TP_EINVAL, "%s: tensors[%zu]: template '%s': a '}' without '{'", origin, k, t);
			c++;
			prev_var = 0;
		}
	}
	return 0;
}

/* The bits of a constant's element: v rounded to nearest (even) in F32 (*bits), or further to
 * BF16's nearest even (the low 16 bits of *bits), the bytes the view serves. 0, or -1 when the
 * rounded value is infinite (v beyond the dtype's largest finite value by half a unit or more, or
 * v itself infinite): such a constant is refused, since an engine would load an infinite scale. */
static int const_bits(double v, st_dtype dt, uint32_t *bits)
{
	float f = (float)v;
	uint32_t u;
	memcpy(&u, &f, 4);
	if (dt == ST_BF16)
		u = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16; /* BF16: rounded to nearest even */
	*bits = u;
	uint32_t exp = dt == ST_BF16 ? 0x7f80u : 0x7f800000u;
	return (u & exp) == exp ? -1 : 0; /* all-ones exponent: infinity (never NaN: JSON has none) */
}

static int parse_entry_body(const cJSON *o, size_t k, const char *origin, tp_ventry *x, tvars *vs, tp_err *e)
{
	static const char *keys[] = {"name", "cat", "from", "stack", "const", "per", "drop", "if", "dtype", "shape",
				     "reshape", "transpose", "other_ranks", "deinterleave", "comment", NULL};
	/* the keywords the one condition "if" replaced (issue 47), each refused naming its replacement,
	 * so that a view written for them is not read with another meaning */
	static const char *const gone[][2] = {
		{"when", "write \"if\": EXPR"},
		{"unless", "write \"if\": \"!(EXPR)\""},
		{"if_missing", "write \"if\": \"!tensor('NAME')\""},
		{"optional", "write \"if\": \"tensor('PIECE') && ...\", naming the pieces a match may lack"},
		/* and the removal keywords "drop" replaced */
		{"remove", "write {\"drop\": {\"entry\": NAME}} (an inherited entry taken away)"},
	};
	const cJSON *it;
	if (!cJSON_IsObject(o))
		return tp_fail(e, TP_EINVAL, "%s: tensors[%zu]: an entry is an object", origin, k);
	cJSON_ArrayForEach(it, o)
	{
		int known = 0;
		for (int i = 0; keys[i]; i++)
			known |= !strcmp(it->string, keys[i]);
		for (size_t i = 0; i < sizeof gone / sizeof gone[0]; i++)
			if (!strcmp(it->string, gone[i][0]))
				return tp_fail(e, TP_EINVAL, "%s: tensors[%zu]: '%s' is no longer a view keyword: %s", origin, k,
					       gone[i][0], gone[i][1]);
		if (!known)
			return tp_fail(e, TP_EINVAL, "%s: tensors[%zu]: unknown field '%s'", origin, k, it->string);
	}
	memset(x, 0, sizeof *x);
	x->name = str_of(o, "name");
	x->stack = str_of(o, "stack");
	/* "if": a plan expression over config.json (the view's defaults under it) and T, and with
	 * tensor('NAME') over the source's tensors for each match (NAME a template of the entry's
	 * variables): parsed here, evaluated by the model (config only: model_view.c) or per match
	 * (tensor(): view_resolve.c) */
	const cJSON *ij = cJSON_GetObjectItemCaseSensitive(o, "if");
	if (ij) {
		x->cond = str_of(o, "if");
		tp_err pe;
		tp_err_clear(&pe);
		if (!x->cond || !*x->cond)
			return tp_fail(e, TP_EINVAL, "%s: tensors[%zu]: \"if\" is a plan expression over config.json and T (a "
				       "string; tensor('NAME') tests the source for a tensor)", origin, k);
		if (tp_expr_check(x->cond, &pe) < 0)
			return tp_fail(e, TP_EINVAL, "%s: tensors[%zu]: \"if\": %s", origin, k, pe.msg);
	}
	const cJSON *cat = cJSON_GetObjectItemCaseSensitive(o, "cat"), *cst = cJSON_GetObjectItemCaseSensitive(o, "const");
	const char *from = str_of(o, "from"), *drop = str_of(o, "drop");
	if (cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(o, "drop")))
		return tp_fail(e, TP_EINVAL, "%s: tensors[%zu]: {\"drop\": {\"entry\": NAME}} takes away an entry this view "
			       "inherits (\"extends\" or \"include\"), and this view inherits none", origin, k);
	int kinds = (cat != NULL) + (from != NULL) + (cst != NULL) + (drop != NULL);
	if (kinds != 1)
		return tp_fail(e, TP_EINVAL, "%s: tensors[%zu]: give exactly one of cat, from, const, drop", origin, k);
	if ((drop || cst) && (cJSON_GetObjectItemCaseSensitive(o, "transpose") ||
			      cJSON_GetObjectItemCaseSensitive(o, "other_ranks") ||
			      cJSON_GetObjectItemCaseSensitive(o, "deinterleave")))
		return tp_fail(e, TP_EINVAL, "%s: tensors[%zu]: \"transpose\", \"other_ranks\" and \"deinterleave\" are for "
			       "cat and from entries (not const or drop)", origin, k);
	if (drop) {
		x->kind = TP_VE_DROP;
		x->per = drop;
		return check_template(drop, origin, k, vs, 1, e);
	}
	if (!x->name)
		return tp_fail(e, TP_EINVAL, "%s: tensors[%zu]: \"name\" (the served name) is required", origin, k);
	if (check_template(x->name, origin, k, vs, 0, e) < 0)
		return -1;
	/* "shape": a constant's own shape; "reshape": a cat / from entry's served shape (one meaning each) */
	const cJSON *shp = cJSON_GetObjectItemCaseSensitive(o, "shape"), *rsh = cJSON_GetObjectItemCaseSensitive(o, "reshape");
	if (cst && rsh)
		return tp_fail(e, TP_EINVAL, "%s: tensors[%zu]: \"reshape\" is for cat and from entries; a constant's shape "
			       "is \"shape\"", origin, k);
	if (!cst && shp)
		return tp_fail(e, TP_EINVAL, "%s: tensors[%zu]: \"shape\" on a cat / from entry is now \"reshape\" (the "
			       "served tensor's shape, its bytes unchanged); \"shape\" is a constant's own shape", origin, k);
	if (cst) {
		x->kind = TP_VE_CONST;
		x->per = str_of(o, "per");
		const char *dt = str_of(cst, "dtype");
		const cJSON *val = cJSON_GetObjectItemCaseSensitive(cst, "value");
		if (!x->per || !dt || !cJSON_IsNumber(val) || st_dtype_parse(dt, strlen(dt), &x->cdtype) < 0 ||
		    (x->cdtype != ST_F32 && x->cdtype != ST_BF16))
			return tp_fail(e, TP_EINVAL, "%s: tensors[%zu]: a constant is {\"dtype\": \"F32\" or \"BF16\", "
				       "\"value\": N} with \"per\": a source template", origin, k);
		if (const_bits(val->valuedouble, x->cdtype, &x->cbits) < 0)
			return tp_fail(e, TP_EINVAL, "%s: tensors[%zu] (%s): the constant %.9g rounds to %sinfinity in %s, "
				       "whose largest finite value is %s (a JSON number beyond about 1.8e308 reads as "
				       "infinity too); a value the dtype cannot hold is refused, not served as infinity",
				       origin, k, x->name, val->valuedouble, val->valuedouble < 0 ? "-" : "+", dt,
				       x->cdtype == ST_F32 ? "3.4028234663852886e38" : "3.3895313892515355e38");
		/* "shape": [d, ...]: every element the value (vLLM's [1] scale slots); none: a scalar */
		uint64_t numel = 1;
		int n = shp ? (cJSON_IsArray(shp) ? cJSON_GetArraySize(shp) : -1) : 0;
		cJSON_ArrayForEach(it, shp)
		{
			double d = cJSON_IsNumber(it) ? it->valuedouble : 0;
			if (!(d >= 1 && d <= TP_VIEW_CONST_MAX) || d != (double)(int64_t)d || x->rs_ndim >= ST_MAX_DIMS ||
			    numel * (uint64_t)d > TP_VIEW_CONST_MAX) { /* numel <= 4096 so far: no overflow */
				n = -1;
				break;
			}
			numel *= (uint64_t)d;
			x->rs_shape[x->rs_ndim++] = (int64_t)d;
		}
		if (n < 0 || n > ST_MAX_DIMS)
			return tp_fail(e, TP_EINVAL, "%s: tensors[%zu]: a constant's \"shape\" is a list of at most %d "
				       "dimensions, each >= 1, of at most %d elements in all", origin, k, ST_MAX_DIMS,
				       TP_VIEW_CONST_MAX);
		return check_template(x->per, origin, k, vs, 0, e);
	}
	x->kind = TP_VE_CAT;
	if (cJSON_GetObjectItemCaseSensitive(o, "dtype")) { /* served as F32 where the pieces are BF16 or F16 */
		const char *dt = str_of(o, "dtype");
		if (!dt || strcmp(dt, "F32"))
			return tp_fail(e, TP_EINVAL, "%s: tensors[%zu]: \"dtype\" is \"F32\" (BF16 or F16 pieces served "
				       "widened to F32, as the engine holds them)", origin, k);
		x->to_f32 = 1;
	}
	const cJSON *tr = cJSON_GetObjectItemCaseSensitive(o, "transpose");
	if (tr) { /* the last two axes swapped: vLLM's gpt-oss experts */
		if (!cJSON_IsBool(tr))
			return tp_fail(e, TP_EINVAL, "%s: tensors[%zu]: \"transpose\" is true or false (the served tensor's last "
				       "two axes swapped)", origin, k);
		x->transpose = cJSON_IsTrue(tr);
		if (x->transpose && (x->to_f32 || x->stack || cat))
			return tp_fail(e, TP_EINVAL, "%s: tensors[%zu]: \"transpose\" takes one \"from\" piece, neither "
				       "stacked nor widened", origin, k);
	}
	if (cJSON_GetObjectItemCaseSensitive(o, "other_ranks")) { /* a row-parallel bias added once */
		const char *v = str_of(o, "other_ranks");
		if (!v || strcmp(v, "zeros"))
			return tp_fail(e, TP_EINVAL, "%s: tensors[%zu]: \"other_ranks\" is \"zeros\" (ranks other than 0 "
				       "serve zeros of the tensor's shape)", origin, k);
		x->rank0_only = 1;
	}
	if (rsh) { /* served reshaped: vLLM's parameter shape where the checkpoint's differs, same bytes */
		int n = cJSON_IsArray(rsh) ? cJSON_GetArraySize(rsh) : 0, frees = 0;
		cJSON_ArrayForEach(it, rsh)
		{
			double d = cJSON_IsNumber(it) ? it->valuedouble : -2;
			/* the range first: a double outside int64_t's cast to it is undefined */
			if (!(d >= -1 && d <= 1e15) || d != (double)(int64_t)d || (d < 0 && d != -1))
				n = 0;
			frees += d == -1;
			if (n > 0 && x->rs_ndim < ST_MAX_DIMS)
				x->rs_shape[x->rs_ndim++] = (int64_t)d;
		}
		if (n < 1 || n > ST_MAX_DIMS || frees > 1)
			return tp_fail(e, TP_EINVAL, "%s: tensors[%zu]: \"reshape\" is a list of 1 to %d dimensions, each >= 1, "
				       "0 (the tensor's own at that axis) or one -1 (what the others leave)", origin, k, ST_MAX_DIMS);
	}
	if (from) {
		x->cat[0] = from;
		x->ncat = 1;
	} else {
		if (!cJSON_IsArray(cat) || cJSON_GetArraySize(cat) < 1 || cJSON_GetArraySize(cat) > 8)
			return tp_fail(e, TP_EINVAL, "%s: tensors[%zu]: \"cat\" is a list of 1 to 8 source templates", origin, k);
		cJSON_ArrayForEach(it, cat)
		{
			if (!cJSON_IsString(it))
				return tp_fail(e, TP_EINVAL, "%s: tensors[%zu]: \"cat\" holds strings", origin, k);
			x->cat[x->ncat++] = it->valuestring;
		}
	}
	for (uint32_t j = 0; j < x->ncat; j++)
		if (check_template(x->cat[j], origin, k, vs, 0, e) < 0)
			return -1;
	const cJSON *dil = cJSON_GetObjectItemCaseSensitive(o, "deinterleave");
	if (dil) { /* per piece: null, or the rows N of a block served as its even rows, then its odd ones */
		uint32_t j = 0, bad = !cJSON_IsArray(dil) || cJSON_GetArraySize(dil) != (int)x->ncat || x->to_f32 ||
				      x->transpose || x->stack;
		const cJSON *items = bad ? NULL : dil;
		cJSON_ArrayForEach(it, items)
		{
			if (cJSON_IsString(it) && *it->valuestring) {
				tp_err pe;
				tp_err_clear(&pe);
				if (tp_expr_check(it->valuestring, &pe) < 0)
					return tp_fail(e, TP_EINVAL, "%s: tensors[%zu]: \"deinterleave\"[%u]: %s", origin, k, j,
						       pe.msg);
				x->dil[j] = it->valuestring;
			} else if (!cJSON_IsNull(it)) {
				bad = 1;
			}
			j++;
		}
		if (bad)
			return tp_fail(e, TP_EINVAL, "%s: tensors[%zu]: \"deinterleave\" is a list of one item per piece (cat "
				       "order), each null or a plan expression N (a block of N rows served as its even rows, "
				       "then its odd rows), on an entry neither stacked, widened nor transposed", origin, k);
	}
	if (x->stack) {
		char var[64];
		snprintf(var, sizeof var, "{%s}", x->stack);
		if (!strstr(x->cat[0], var) || strstr(x->name, var))
			return tp_fail(e, TP_EINVAL, "%s: tensors[%zu]: \"stack\": \"%s\" must appear in the pieces and not in "
				       "the served name", origin, k, x->stack);
	}
	return 0;
}

/* Whether condition c reads one of the entry's template variables (an identifier outside quotes
 * spelled as one): such a condition is decided for each match, with the match's values bound. -1
 * (e set) where a variable it reads is too long for an expression's variable (15 characters). */
static int reads_var(const char *c, const tvars *vs, const char *origin, size_t k, tp_err *e)
{
	int hit = 0;
	for (const char *p = c; *p;) {
		if (*p == '\'' || *p == '"') { /* a string literal: no identifiers in it */
			const char *q = strchr(p + 1, *p);
			p = q ? q + 1 : p + strlen(p);
			continue;
		}
		int id0 = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || *p == '_';
		if (!id0) {
			p++;
			continue;
		}
		const char *q = p;
		while ((*q >= 'a' && *q <= 'z') || (*q >= 'A' && *q <= 'Z') || (*q >= '0' && *q <= '9') || *q == '_' ||
		       *q == '.')
			q++;
		for (int j = 0; j < vs->n; j++)
			if (strlen(vs->name[j]) == (size_t)(q - p) && !strncmp(vs->name[j], p, (size_t)(q - p))) {
				if (q - p > 15)
					return tp_fail(e, TP_EINVAL, "%s: tensors[%zu]: \"if\" reads the variable '%s': a variable "
						       "an \"if\" reads is at most 15 characters", origin, k, vs->name[j]);
				hit = 1;
			}
		p = q;
	}
	return hit;
}

/* One entry of "tensors" into x: 0, or -1 with e set naming origin and k. An "if" that reads
 * tensor() or one of the entry's variables is decided per match (per_match). */
static int parse_entry(const cJSON *o, size_t k, const char *origin, tp_ventry *x, tp_err *e)
{
	tvars vs = {.n = 0};
	if (parse_entry_body(o, k, origin, x, &vs, e) < 0)
		return -1;
	if (!x->cond)
		return 0;
	int rv = reads_var(x->cond, &vs, origin, k, e);
	if (rv < 0)
		return -1;
	x->per_match = rv || strstr(x->cond, "tensor(") != NULL;
	return 0;
}

static int str_list(const cJSON *a, const char **out, uint32_t cap, uint32_t *n)
{
	const cJSON *it;
	*n = 0;
	if (cJSON_IsString(a)) {
		out[(*n)++] = a->valuestring;
		return 0;
	}
	if (!cJSON_IsArray(a))
		return -1;
	cJSON_ArrayForEach(it, a)
	{
		if (!cJSON_IsString(it) || *n == cap)
			return -1;
		out[(*n)++] = it->valuestring;
	}
	return 0;
}

/* "pp": {"layers": "model.layers.", "count": KEY, "first": [PREFIX...], "last": [PREFIX...],
 * "model_types": [...]} (view.h). Absent: no stages. Returns 0, or -1 with e set. */
static int parse_pp(const cJSON *pp, const char *origin, tp_view *v, tp_err *e)
{
	if (!pp)
		return 0;
	const cJSON *it;
	int ok = cJSON_IsObject(pp);
	cJSON_ArrayForEach(it, pp)
	ok = ok && (!strcmp(it->string, "layers") || !strcmp(it->string, "count") || !strcmp(it->string, "first") ||
		    !strcmp(it->string, "last") || !strcmp(it->string, "every") || !strcmp(it->string, "model_types"));
	v->pp_layers = str_of(pp, "layers");
	v->pp_count = str_of(pp, "count");
	ok = ok && v->pp_layers && v->pp_layers[0] && v->pp_count && v->pp_count[0] &&
	     str_list(cJSON_GetObjectItemCaseSensitive(pp, "first"), v->pp_first, 4, &v->npp_first) == 0 &&
	     str_list(cJSON_GetObjectItemCaseSensitive(pp, "last"), v->pp_last, 4, &v->npp_last) == 0 &&
	     (!cJSON_GetObjectItemCaseSensitive(pp, "every") ||
	      str_list(cJSON_GetObjectItemCaseSensitive(pp, "every"), v->pp_every, 4, &v->npp_every) == 0) &&
	     str_list(cJSON_GetObjectItemCaseSensitive(pp, "model_types"), v->pp_types, 32, &v->npp_types) == 0 &&
	     v->npp_types > 0;
	for (uint32_t k = 0; ok && k < v->npp_first; k++)
		ok = v->pp_first[k][0] != 0;
	for (uint32_t k = 0; ok && k < v->npp_last; k++)
		ok = v->pp_last[k][0] != 0;
	for (uint32_t k = 0; ok && k < v->npp_every; k++)
		ok = v->pp_every[k][0] != 0;
	if (!ok) {
		v->pp_layers = NULL;
		return tp_fail(e, TP_EINVAL, "%s: \"pp\" is {\"layers\": a name prefix such as \"model.layers.\", \"count\": "
			       "the config.json key counting them, \"first\", \"last\" and \"every\" (optional): up to 4 "
			       "name prefixes each (the first, the last and every stage's tensors), \"model_types\": the model types the stages are "
			       "proven for}", origin);
	}
	return 0;
}

/* The key an entry of "tensors" is replaced by in a view that extends another: its served name,
 * or for a drop entry its template (a drop entry replaces a drop entry only). */
static int same_entry(const cJSON *a, const cJSON *b)
{
	const char *na = str_of(a, "name"), *nb = str_of(b, "name"), *da = str_of(a, "drop"), *db = str_of(b, "drop");
	return (na && nb && !strcmp(na, nb)) || (!na && !nb && da && db && !strcmp(da, db));
}

/* The name an entry {"drop": {"entry": NAME}} takes away (an inherited entry), or NULL where it is
 * not one. */
static const char *drop_entry_of(const cJSON *it)
{
	const cJSON *d = cJSON_GetObjectItemCaseSensitive(it, "drop");
	return cJSON_IsObject(d) ? str_of(d, "entry") : NULL;
}

/* Puts object over (a view file, or a fragment: fragment set) over base, as "extends" and
 * "include" say: each top-level field of a view but extends, include, tensors, refuse, defaults
 * and drop replaces base's, "drop": [FIELD, ...] taking base's fields away (a fragment's other
 * fields are its own: name, description; null is refused: "drop" replaced it); each entry of
 * "tensors" replaces base's entry of the same key (same_entry) where it stands, an entry
 * {"drop": {"entry": NAME}} takes away base's entry making NAME (or dropping NAME: a drop entry's
 * template), and any other entry is appended (over's own entries never replace one another: two
 * of one served name are the resolver's to refuse or, where their sources never meet, to serve);
 * "refuse" entries are appended to base's; "defaults" are merged key by key (over's value wins).
 * what names base in messages. Returns 0, or -1 with e set (base is then the caller's to free). */
static int merge_over(cJSON *base, const cJSON *over, int fragment, const char *origin, const char *what, tp_err *e)
{
	const cJSON *it, *dr = fragment ? NULL : cJSON_GetObjectItemCaseSensitive(over, "drop");
	int oom = 0;
	static const char *const kept[] = {"tpfs_view", "engine", "name", "extends", "include", "tensors", "refuse",
					   "defaults", "drop", "fragment", NULL};
	if (dr && (!cJSON_IsArray(dr) || cJSON_GetArraySize(dr) < 1 || cJSON_GetArraySize(dr) > 16))
		return tp_fail(e, TP_EINVAL, "%s: \"drop\" (view level) is a list of 1 to 16 fields of view '%s' not "
			       "inherited", origin, what);
	cJSON_ArrayForEach(it, dr) /* "drop": ["pp", ...]: base's fields not inherited */
	{
		const char *f = cJSON_IsString(it) ? it->valuestring : NULL;
		int fixed = 0;
		for (int i = 0; f && kept[i]; i++)
			fixed |= !strcmp(f, kept[i]);
		if (!f || fixed || !cJSON_GetObjectItemCaseSensitive(base, f) || cJSON_GetObjectItemCaseSensitive(over, f))
			return tp_fail(e, TP_EINVAL, "%s: \"drop\": %s%s%s: a field of view '%s' that this view neither sets nor "
				       "must inherit (not tensors, refuse, defaults, name, engine)", origin, f ? "'" : "",
				       f ? f : "not a field name", f ? "'" : "", what);
		cJSON_DeleteItemFromObjectCaseSensitive(base, f);
	}
	cJSON_ArrayForEach(it, over)
	{
		const char *k = it->string;
		int list = !strcmp(k, "refuse") || !strcmp(k, "defaults");
		if (!strcmp(k, "extends") || !strcmp(k, "include") || !strcmp(k, "tensors") || (!fragment && !strcmp(k, "drop")) ||
		    (fragment && !list))
			continue;
		cJSON *have = cJSON_GetObjectItemCaseSensitive(base, k);
		if (list && have && cJSON_IsArray(have) == cJSON_IsArray(it) && cJSON_IsObject(have) == cJSON_IsObject(it)) {
			const cJSON *x;
			cJSON_ArrayForEach(x, it)
			{
				cJSON *dup = cJSON_Duplicate(x, 1);
				oom |= !dup;
				if (dup && cJSON_IsArray(have))
					cJSON_AddItemToArray(have, dup);
				else if (dup && cJSON_GetObjectItemCaseSensitive(have, x->string))
					cJSON_ReplaceItemInObjectCaseSensitive(have, x->string, dup);
				else if (dup)
					cJSON_AddItemToObject(have, x->string, dup);
			}
			continue;
		}
		if (cJSON_IsNull(it)) { /* before issue 47, "pp": null took the field away: "drop" does */
			if (list) /* the parent's refusals and defaults always hold */
				return tp_fail(e, TP_EINVAL, "%s: \"%s\": null: a view adds to what it extends, it cannot take "
					       "it away", origin, k);
			return tp_fail(e, TP_EINVAL, "%s: \"%s\": null no longer takes an inherited field away: write "
				       "\"drop\": [\"%s\"]", origin, k, k);
		}
		cJSON *dup = cJSON_Duplicate(it, 1);
		oom |= !dup;
		if (dup && have)
			cJSON_ReplaceItemInObjectCaseSensitive(base, k, dup);
		else if (dup)
			cJSON_AddItemToObject(base, k, dup);
	}
	cJSON *pt = cJSON_GetObjectItemCaseSensitive(base, "tensors");
	const cJSON *ct = cJSON_GetObjectItemCaseSensitive(over, "tensors");
	if (ct && !cJSON_IsArray(ct))
		return tp_fail(e, TP_EINVAL, "%s: \"tensors\" is a list", origin);
	if (!cJSON_IsArray(pt))
		return tp_fail(e, TP_EINVAL, "%s: view '%s' has no \"tensors\" list", origin, what);
	int nbase = cJSON_GetArraySize(pt); /* over's entries replace base's only, never each other */
	cJSON_ArrayForEach(it, ct)
	{
		const char *rm = drop_entry_of(it);
		int k = 0;
		if (cJSON_GetObjectItemCaseSensitive(it, "remove"))
			return tp_fail(e, TP_EINVAL, "%s: 'remove' is no longer a view keyword: write {\"drop\": {\"entry\": "
				       "NAME}} (an inherited entry taken away)", origin);
		if (cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(it, "drop"))) {
			cJSON *x, *hit = NULL;
			cJSON_ArrayForEach(x, pt)
			{
				const char *n = str_of(x, "name") ? str_of(x, "name") : str_of(x, "drop");
				if (!hit && k++ < nbase && rm && n && !strcmp(n, rm))
					hit = x;
			}
			if (!hit || cJSON_GetArraySize(it) != 1 || cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(it, "drop")) != 1)
				return tp_fail(e, TP_EINVAL, "%s: {\"drop\": {\"entry\": NAME}} takes away the entry of view '%s' "
					       "making NAME, or dropping NAME (%s: none)", origin, what, rm ? rm : "not a name");
			cJSON_Delete(cJSON_DetachItemViaPointer(pt, hit));
			nbase--;
			continue;
		}
		cJSON *dup = cJSON_Duplicate(it, 1), *x, *hit = NULL;
		oom |= !dup;
		cJSON_ArrayForEach(x, pt)
		{
			if (!hit && k++ < nbase && same_entry(x, it))
				hit = x;
		}
		if (dup && hit)
			cJSON_ReplaceItemViaPointer(pt, hit, dup);
		else if (dup)
			cJSON_AddItemToArray(pt, dup);
	}
	return oom ? tp_fail(e, TP_ENOMEM, "%s: out of memory", origin) : 0;
}

/* The string s with every ${P} of the fragment's parameters (names[k] -> vals[k], n of them)
 * replaced, into out (cap bytes). Returns 0, 1 where out is too short, -1 where s holds a ${...}
 * that names no parameter (*bad: where it starts). */
static int subst_one(const char *s, const char *const *names, const char *const *vals, int n, char *out, size_t cap,
		     const char **bad)
{
	size_t w = 0;
	for (const char *c = s; *c;) {
		const char *add = c;
		size_t al = 1;
		if (c[0] == '$' && c[1] == '{') {
			const char *end = strchr(c, '}');
			int hit = -1;
			for (int k = 0; end && k < n && hit < 0; k++)
				if (strlen(names[k]) == (size_t)(end - c - 2) && !strncmp(names[k], c + 2, (size_t)(end - c - 2)))
					hit = k;
			if (hit < 0) {
				*bad = c;
				return -1;
			}
			add = vals[hit];
			al = strlen(add);
			c = end + 1;
		} else {
			c++;
		}
		if (w + al >= cap)
			return 1;
		memcpy(out + w, add, al);
		w += al;
	}
	out[w] = 0;
	return 0;
}

/* Every string under node (values, not keys) with the parameters substituted (subst_one). */
static int subst_tree(cJSON *node, const char *const *names, const char *const *vals, int n, const char *origin,
		      const char *frag, tp_err *e)
{
	cJSON *it;
	cJSON_ArrayForEach(it, node)
	{
		if (cJSON_IsString(it) && strstr(it->valuestring, "${")) {
			char buf[1024];
			const char *bad = NULL;
			int rc = subst_one(it->valuestring, names, vals, n, buf, sizeof buf, &bad);
			if (rc < 0)
				return tp_fail(e, TP_EINVAL, "%s: fragment '%s': '%s': %.40s names no parameter of the fragment "
					       "(its \"params\")", origin, frag, it->valuestring, bad);
			if (rc > 0)
				return tp_fail(e, TP_EINVAL, "%s: fragment '%s': '%s' is over 1023 characters with its parameters",
					       origin, frag, it->valuestring);
			if (!cJSON_SetValuestring(it, buf))
				return tp_fail(e, TP_ENOMEM, "%s: out of memory", origin);
		} else if ((cJSON_IsArray(it) || cJSON_IsObject(it)) &&
			   subst_tree(it, names, vals, n, origin, frag, e) < 0) {
			return -1;
		}
	}
	return 0;
}

/* A fragment's parameters: its "params" ({NAME: default string, or null: required}, at most 8)
 * given by `with` (an include's {"fragment": NAME, "with": {NAME: VALUE}}; NULL: none given). Where
 * the fragment is read alone (included 0), a required parameter stands for its own name,
 * put into every string of its tensors and refuse. A parameter `with` names that the fragment has
 * not, a value that is not a string, and one required and not given are refused. Returns 0, or -1
 * with e set. */
static int frag_params(cJSON *frag, const cJSON *with, int included, const char *origin, const char *fname, tp_err *e)
{
	const cJSON *ps = cJSON_GetObjectItemCaseSensitive(frag, "params"), *it;
	const char *names[8], *vals[8];
	int n = 0;
	if (ps && (!cJSON_IsObject(ps) || cJSON_GetArraySize(ps) > 8))
		return tp_fail(e, TP_EINVAL, "%s: fragment '%s': \"params\" is an object of at most 8 parameter names, each "
			       "with its default (a string) or null (required)", origin, fname);
	if (with && !cJSON_IsObject(with))
		return tp_fail(e, TP_EINVAL, "%s: include of fragment '%s': \"with\" is an object of its parameters' values",
			       origin, fname);
	cJSON_ArrayForEach(it, with)
	{
		if (!cJSON_GetObjectItemCaseSensitive(ps, it->string) || !cJSON_IsString(it))
			return tp_fail(e, TP_EINVAL, "%s: include of fragment '%s': \"with\": '%s' is not one of its "
				       "\"params\" (or its value is not a string)", origin, fname, it->string);
	}
	cJSON_ArrayForEach(it, ps)
	{
		const cJSON *v = with ? cJSON_GetObjectItemCaseSensitive(with, it->string) : NULL;
		if (!cJSON_IsString(it) && !cJSON_IsNull(it))
			return tp_fail(e, TP_EINVAL, "%s: fragment '%s': parameter '%s': its default is a string, or null "
				       "(required)", origin, fname, it->string);
		if (!v && cJSON_IsNull(it) && included)
			return tp_fail(e, TP_EINVAL, "%s: include of fragment '%s': parameter '%s' is required (\"with\": "
				       "{\"%s\": ...})", origin, fname, it->string, it->string);
		names[n] = it->string;
		vals[n++] = v ? v->valuestring : cJSON_IsString(it) ? it->valuestring : it->string;
	}
	cJSON *t = cJSON_GetObjectItemCaseSensitive(frag, "tensors"), *r = cJSON_GetObjectItemCaseSensitive(frag, "refuse");
	if ((t && subst_tree(t, names, vals, n, origin, fname, e) < 0) ||
	    (r && subst_tree(r, names, vals, n, origin, fname, e) < 0))
		return -1;
	cJSON_DeleteItemFromObjectCaseSensitive(frag, "params");
	return 0;
}

static cJSON *extend(cJSON *child, const char *origin, int depth, tp_err *e);

/* The built-in view (fragment 0: extended already) or fragment (fragment 1) NAME of engine, parsed;
 * NULL with e set where there is none. */
#define BINDEX_CAP 512 /* built-in views the index below holds (more: each lookup parses them all) */

/* The name, engine and fragment flag of each built-in view, read once per process: builtin() then parses
 * only the text it returns, not every built-in text for each "extends" and "include" (choosing the view
 * of a --view vllm mount parsed about 66 x 66 texts: 0.15 s of CPU). Planning is single-threaded. */
static struct bview {
	char name[96], engine[32];
	int fragment, ok; /* ok: read (a text that does not parse, or longer names, is looked at as before) */
} bindex[BINDEX_CAP];
static int bindex_n = -1;

static void bindex_make(void)
{
	bindex_n = tp_view_builtin_count() <= BINDEX_CAP ? tp_view_builtin_count() : 0;
	for (int i = 0; i < bindex_n; i++) {
		size_t l;
		const char *t = tp_view_builtin_text(i, &l);
		tp_err e;
		tp_err_clear(&e);
		cJSON *c = tp_json_parse("built-in view", t, l, &e);
		const char *n = c ? str_of(c, "name") : NULL, *en = c ? str_of(c, "engine") : NULL;
		struct bview *b = &bindex[i];
		b->fragment = c && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(c, "fragment"));
		b->ok = n && en && strlen(n) < sizeof b->name && strlen(en) < sizeof b->engine;
		if (b->ok) {
			memcpy(b->name, n, strlen(n) + 1);
			memcpy(b->engine, en, strlen(en) + 1);
		}
		cJSON_Delete(c);
	}
}

static cJSON *builtin(const char *name, const char *engine, int fragment, const char *origin, int depth, tp_err *e)
{
	if (bindex_n < 0)
		bindex_make();
	for (int i = 0; i < tp_view_builtin_count(); i++) {
		const struct bview *b = i < bindex_n ? &bindex[i] : NULL;
		if (b && b->ok && (strcmp(b->name, name) || b->fragment != fragment || (engine && strcmp(b->engine, engine))))
			continue; /* not this one (known without parsing it again) */
		size_t l;
		const char *t = tp_view_builtin_text(i, &l);
		cJSON *c = tp_json_parse("built-in view", t, l, e);
		const char *n = c ? str_of(c, "name") : NULL, *en = c ? str_of(c, "engine") : NULL;
		int frag = c && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(c, "fragment"));
		if (c && n && !strcmp(n, name) && frag == fragment && (!engine || (en && !strcmp(en, engine))))
			return fragment ? c : extend(c, origin, depth + 1, e);
		cJSON_Delete(c);
	}
	tp_fail(e, TP_EINVAL, "%s: \"%s\": no built-in %s %s '%s'", origin, fragment ? "include" : "extends",
		engine ? engine : "", fragment ? "fragment" : "view", name);
	return NULL;
}

/* "extends": NAME and "include": [FRAGMENT, ...]. The view is the built-in view NAME (of the same
 * engine, or ENGINE/NAME: another engine's, whose entries an engine shares where both hold the
 * same names, as SGLang's views extend vLLM's; none: an empty view), then each built-in fragment
 * in order (views/<engine>/fragments: entries shared by views, such as a quantization's scales; ENGINE/NAME:
 * another engine's fragment), then this file, each put over what
 * came before (merge_over). A parent may itself extend another, 4 levels at most; a fragment
 * neither extends nor includes. Consumes child; returns the merged object, or NULL with e set. */
static cJSON *extend(cJSON *child, const char *origin, int depth, tp_err *e)
{
	const char *base = str_of(child, "extends"), *engine = str_of(child, "engine");
	const cJSON *inc = cJSON_GetObjectItemCaseSensitive(child, "include"), *it;
	int ext = cJSON_GetObjectItemCaseSensitive(child, "extends") != NULL;
	cJSON *parent = NULL;
	if (!ext && !inc)
		return child;
	if ((ext && !base) || depth >= 4)
		tp_fail(e, TP_EINVAL, "%s: \"extends\" names one built-in view (at most 4 levels deep)", origin);
	else if (inc && (!cJSON_IsArray(inc) || cJSON_GetArraySize(inc) < 1 || cJSON_GetArraySize(inc) > 16))
		tp_fail(e, TP_EINVAL, "%s: \"include\" is a list of 1 to 16 built-in fragments", origin);
	else if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(child, "fragment")))
		tp_fail(e, TP_EINVAL, "%s: a fragment neither extends a view nor includes fragments", origin);
	else if (ext && strchr(base, '/')) { /* ENGINE/NAME */
		char en[32];
		size_t l = (size_t)(strchr(base, '/') - base);
		if (l == 0 || l >= sizeof en)
			tp_fail(e, TP_EINVAL, "%s: \"extends\": \"%s\" is NAME or ENGINE/NAME", origin, base);
		else {
			memcpy(en, base, l);
			en[l] = 0;
			parent = builtin(base + l + 1, en, 0, origin, depth, e);
		}
	} else if (ext)
		parent = builtin(base, engine, 0, origin, depth, e);
	else if (!(parent = cJSON_CreateObject()) || !cJSON_AddArrayToObject(parent, "tensors")) {
		tp_fail(e, TP_ENOMEM, "%s: out of memory", origin);
		cJSON_Delete(parent);
		parent = NULL;
	}
	const cJSON *incs = parent ? inc : NULL;
	cJSON_ArrayForEach(it, incs)
	{
		/* NAME, or {"fragment": NAME, "with": {PARAM: VALUE}}: a fragment that takes parameters */
		const cJSON *with = cJSON_IsObject(it) ? cJSON_GetObjectItemCaseSensitive(it, "with") : NULL;
		const char *fn = cJSON_IsString(it) ? it->valuestring : str_of(it, "fragment");
		const char *slash = fn ? strchr(fn, '/') : NULL;
		char fen[32]; /* ENGINE/NAME: another engine's fragment, as "extends" names another engine's view */
		int shape_ok = cJSON_IsString(it) ||
			       (fn && cJSON_GetArraySize(it) == 1 + (with != NULL));
		if (!shape_ok || (slash && (slash == fn || (size_t)(slash - fn) >= sizeof fen))) {
			tp_fail(e, TP_EINVAL, "%s: \"include\" holds fragment names (NAME or ENGINE/NAME), or {\"fragment\": "
				"NAME, \"with\": {PARAM: VALUE, ...}}", origin);
			cJSON_Delete(parent);
			parent = NULL;
			break;
		}
		if (slash) {
			memcpy(fen, fn, (size_t)(slash - fn));
			fen[slash - fn] = 0;
		}
		cJSON *frag = builtin(slash ? slash + 1 : fn, slash ? fen : engine, 1, origin, depth, e);
		if (!frag || frag_params(frag, with, 1, origin, fn, e) < 0 ||
		    merge_over(parent, frag, 1, origin, fn, e) < 0) {
			cJSON_Delete(frag);
			cJSON_Delete(parent);
			parent = NULL;
			break;
		}
		cJSON_Delete(frag);
	}
	if (parent && merge_over(parent, child, 0, origin, base ? base : "(included)", e) < 0) {
		cJSON_Delete(parent);
		parent = NULL;
	}
	cJSON_Delete(child);
	return parent;
}

/* Whether a view's "rules" parse as a plan's rules (a list of 1 to 64 rule objects): 0, or -1 with e
 * set naming the view. */
static int check_rules(const cJSON *rules, const char *origin, tp_err *e)
{
	if (!cJSON_IsArray(rules) || !cJSON_GetArraySize(rules) || cJSON_GetArraySize(rules) > 64)
		return tp_fail(e, TP_EINVAL, "%s: \"rules\": a list of 1 to 64 plan rules (the plan file's format)", origin);
	tp_plan p;
	int rc = tp_view_rules_plan(rules, "(check)", origin, &p, e);
	if (rc == 0)
		tp_plan_free(&p);
	return rc;
}

int tp_view_rules_plan(const cJSON *rules, const char *name, const char *origin, tp_plan *p, tp_err *e)
{
	cJSON *w = cJSON_CreateObject();
	cJSON *dup = cJSON_Duplicate(rules, 1);
	char *text = NULL;
	if (w && dup && cJSON_AddNumberToObject(w, "tpfs_plan", 1) && cJSON_AddStringToObject(w, "name", name) &&
	    cJSON_AddItemToObject(w, "rules", dup)) {
		dup = NULL;
		text = cJSON_PrintUnformatted(w);
	}
	cJSON_Delete(dup);
	cJSON_Delete(w);
	if (!text)
		return tp_fail(e, TP_ENOMEM, "out of memory");
	char where[300];
	tp_fmt(where, sizeof where, "%s: \"rules\"", origin);
	int rc = tp_plan_parse(text, strlen(text), where, p, e);
	cJSON_free(text);
	return rc;
}

int tp_view_parse(const char *text, size_t len, const char *origin, tp_view *v, tp_err *e)
{
	static const char *keys[] = {"tpfs_view", "engine", "name", "proven", "plans", "model_types", "quant_methods", "pad_vocab",
				     "keep_rest", "tensors", "description", "comment", "defaults", "drop_layers", "drop", "refuse",
				     "fragment", "pp", "ep", "ep_round_robin", "dp_ep", "rules", "rename", NULL};
	static const char *fkeys[] = {"tpfs_view", "engine", "name", "fragment", "description", "comment", "tensors",
				      "refuse", "defaults", NULL};
	memset(v, 0, sizeof *v);
	tp_fmt(v->origin, sizeof v->origin, "%s", origin);
	v->json = tp_json_parse(origin, text, len, e);
	if (!v->json)
		return -1;
	if (!cJSON_IsObject(v->json)) {
		tp_fail(e, TP_EINVAL, "%s: a view file is a JSON object", origin);
		goto bad;
	}
	if (!(v->json = extend(v->json, origin, 0, e)))
		return -1;
	if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(v->json, "fragment")) &&
	    frag_params(v->json, NULL, 0, origin, str_of(v->json, "name") ? str_of(v->json, "name") : "(this)", e) < 0)
		goto bad;
	const cJSON *o = v->json, *it;
	v->fragment = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "fragment"));
	const char *const *ks = v->fragment ? fkeys : keys;
	cJSON_ArrayForEach(it, o)
	{
		int known = 0;
		for (int i = 0; ks[i]; i++)
			known |= !strcmp(it->string, ks[i]);
		if (!known) {
			tp_fail(e, TP_EINVAL, "%s: %s field '%s'", origin,
				v->fragment ? "a fragment holds tensors, refuse and defaults only, not the" : "unknown",
				it->string);
			goto bad;
		}
	}
	const cJSON *ver = cJSON_GetObjectItemCaseSensitive(o, "tpfs_view");
	v->name = str_of(o, "name");
	v->engine = str_of(o, "engine");
	if (!cJSON_IsNumber(ver) || ver->valuedouble != 1 || !v->name || !v->engine) {
		tp_fail(e, TP_EINVAL, "%s: \"tpfs_view\": 1, \"engine\" and \"name\" are required", origin);
		goto bad;
	}
	const char *proven[4]; /* the engine versions it was proven against: the first is shown */
	uint32_t np = 0;
	if (cJSON_GetObjectItemCaseSensitive(o, "proven")) {
		if (str_list(cJSON_GetObjectItemCaseSensitive(o, "proven"), proven, 4, &np) < 0) {
			tp_fail(e, TP_EINVAL, "%s: \"proven\": a list of at most 4 strings", origin);
			goto bad;
		}
		v->proven = np ? proven[0] : NULL;
	}
	if (!v->fragment &&
	    (str_list(cJSON_GetObjectItemCaseSensitive(o, "plans"), v->plans, 16, &v->nplans) < 0 || !v->nplans)) {
		tp_fail(e, TP_EINVAL, "%s: \"plans\": the plans the view applies to (at most 16 names)", origin);
		goto bad;
	}
	const cJSON *qm = cJSON_GetObjectItemCaseSensitive(o, "quant_methods");
	if (qm && (str_list(qm, v->quant_methods, 8, &v->nquant) < 0 || !v->nquant)) {
		tp_fail(e, TP_EINVAL, "%s: \"quant_methods\": a list of 1 to 8 quantization_config.quant_method names",
			origin);
		goto bad;
	}
	const cJSON *mt = cJSON_GetObjectItemCaseSensitive(o, "model_types");
	if (mt && str_list(mt, v->model_types, 32, &v->nmodel_types) < 0) {
		tp_fail(e, TP_EINVAL, "%s: \"model_types\": a list of at most 32 names", origin);
		goto bad;
	}
	const cJSON *pv = cJSON_GetObjectItemCaseSensitive(o, "pad_vocab");
	if (pv && (!cJSON_IsNumber(pv) || pv->valuedouble < 1 || pv->valuedouble > 65536 ||
		   pv->valuedouble != (double)(uint64_t)pv->valuedouble)) {
		tp_fail(e, TP_EINVAL, "%s: \"pad_vocab\": a whole number from 1 to 65536", origin);
		goto bad;
	}
	v->pad_vocab = pv ? (uint64_t)pv->valuedouble : 0;
	const cJSON *kr = cJSON_GetObjectItemCaseSensitive(o, "keep_rest");
	v->keep_rest = !kr || cJSON_IsTrue(kr);
	if (cJSON_GetObjectItemCaseSensitive(o, "drop_layers")) { /* replaced by a drop entry (issue 47) */
		tp_fail(e, TP_EINVAL, "%s: 'drop_layers' is no longer a view keyword: write the tensors entry {\"drop\": "
			"\"PREFIX{n}.*\", \"if\": \"n >= KEY\"}", origin);
		goto bad;
	}
	if (cJSON_GetObjectItemCaseSensitive(o, "drop")) { /* merge_over consumed a view's that inherits */
		tp_fail(e, TP_EINVAL, "%s: \"drop\" (view level) takes away fields a view inherits, and this view extends "
			"none", origin);
		goto bad;
	}
	if (parse_pp(cJSON_GetObjectItemCaseSensitive(o, "pp"), origin, v, e) < 0)
		goto bad;
	const cJSON *ep = cJSON_GetObjectItemCaseSensitive(o, "ep");
	if (ep && (str_list(ep, v->ep_types, 32, &v->nep_types) < 0 || !v->nep_types)) {
		tp_fail(e, TP_EINVAL, "%s: \"ep\": the model types whose expert parallelism is proven (1 to 32 names)", origin);
		goto bad;
	}
	const cJSON *eprr = cJSON_GetObjectItemCaseSensitive(o, "ep_round_robin");
	if (eprr && (str_list(eprr, v->ep_rr_types, 32, &v->nep_rr_types) < 0 || !v->nep_rr_types)) {
		tp_fail(e, TP_EINVAL, "%s: \"ep_round_robin\": the model types whose round_robin expert placement is "
			"proven (1 to 32 names)", origin);
		goto bad;
	}
	const cJSON *dpep = cJSON_GetObjectItemCaseSensitive(o, "dp_ep");
	if (dpep && (str_list(dpep, v->dp_ep_types, 32, &v->ndp_ep_types) < 0 || !v->ndp_ep_types)) {
		tp_fail(e, TP_EINVAL, "%s: \"dp_ep\": the model types whose data parallelism with expert parallelism "
			"(--dp with --ep) is proven (1 to 32 names)", origin);
		goto bad;
	}
	const cJSON *rn = cJSON_GetObjectItemCaseSensitive(o, "rename");
	if (rn) { /* [{"from": P, "to": Q, "names": [TEMPLATE...]}]: the prefix of tensors no entry uses */
		int okn = cJSON_IsArray(rn) && cJSON_GetArraySize(rn) >= 1 && cJSON_GetArraySize(rn) <= TP_VIEW_RENAMES;
		size_t k = 0;
		cJSON_ArrayForEach(it, rn)
		{
			const char *f = str_of(it, "from"), *t = str_of(it, "to");
			const cJSON *ns = cJSON_GetObjectItemCaseSensitive(it, "names"), *x;
			int nk = cJSON_GetArraySize(it) - 2 - (ns != NULL);
			okn = okn && cJSON_IsObject(it) && f && t && f[0] && !nk && !strchr(f, '{') && !strchr(t, '{') &&
			      (!ns || (cJSON_IsArray(ns) && cJSON_GetArraySize(ns) > 0));
			const cJSON *nsl = okn ? ns : (const cJSON *)NULL;
			cJSON_ArrayForEach(x, nsl)
			{
				tvars vs = {.n = 0};
				tp_err te;
				tp_err_clear(&te);
				okn = okn && cJSON_IsString(x) && x->valuestring[0] && check_template(x->valuestring, origin, k, &vs, 0, &te) == 0;
			}
			if (okn) {
				v->ren_from[v->nren] = f;
				v->ren_to[v->nren] = t;
				v->ren_names[v->nren++] = ns;
			}
			k++;
		}
		if (!okn) {
			tp_fail(e, TP_EINVAL, "%s: \"rename\": a list of 1 to %d {\"from\": PREFIX, \"to\": PREFIX, \"names\": "
				"[TEMPLATE, ...]} (prefixes plain text, FROM not empty; names optional: the rest of each name "
				"renamed, {var} binding digits)", origin, TP_VIEW_RENAMES);
			goto bad;
		}
	}
	v->refuse = cJSON_GetObjectItemCaseSensitive(o, "refuse");
	if (v->refuse) {
		int okr = cJSON_IsArray(v->refuse);
		cJSON_ArrayForEach(it, v->refuse)
		okr = okr && cJSON_IsObject(it) && cJSON_GetArraySize(it) == 2 &&
		      cJSON_IsString(cJSON_GetObjectItemCaseSensitive(it, "if")) &&
		      cJSON_IsString(cJSON_GetObjectItemCaseSensitive(it, "reason"));
		if (!okr) {
			tp_fail(e, TP_EINVAL, "%s: \"refuse\": a list of {\"if\": expression, \"reason\": text}", origin);
			goto bad;
		}
		size_t k = 0;
		cJSON_ArrayForEach(it, v->refuse)
		{
			tp_err pe;
			tp_err_clear(&pe);
			if (tp_expr_check(cJSON_GetObjectItemCaseSensitive(it, "if")->valuestring, &pe) < 0) {
				tp_fail(e, TP_EINVAL, "%s: refuse[%zu]: \"if\": %s", origin, k, pe.msg);
				goto bad;
			}
			k++;
		}
	}
	v->defaults = cJSON_GetObjectItemCaseSensitive(o, "defaults");
	if (v->defaults) {
		int okd = cJSON_IsObject(v->defaults);
		cJSON_ArrayForEach(it, v->defaults)
		okd = okd && (cJSON_IsBool(it) || cJSON_IsNumber(it));
		if (!okd) {
			tp_fail(e, TP_EINVAL, "%s: \"defaults\": an object of config.json keys and their values (true, "
				"false or a number) where config.json has none", origin);
			goto bad;
		}
	}
	v->rules = cJSON_GetObjectItemCaseSensitive(o, "rules");
	if (v->rules && check_rules(v->rules, origin, e) < 0)
		goto bad;
	const cJSON *ts = cJSON_GetObjectItemCaseSensitive(o, "tensors");
	if (!cJSON_IsArray(ts)) {
		tp_fail(e, TP_EINVAL, "%s: \"tensors\": a list of entries", origin);
		goto bad;
	}
	v->e = calloc((size_t)cJSON_GetArraySize(ts) + 1, sizeof *v->e);
	if (!v->e) {
		tp_fail(e, TP_ENOMEM, "out of memory");
		goto bad;
	}
	cJSON_ArrayForEach(it, ts)
	{
		/* a fragment's {"drop": {"entry": NAME}}: applied, and checked, where a view includes it (merge_over) */
		if (v->fragment && cJSON_IsObject(it) && cJSON_GetArraySize(it) == 1 && drop_entry_of(it))
			continue;
		if (parse_entry(it, v->ne, origin, &v->e[v->ne], e) < 0)
			goto bad;
		v->ne++;
	}
	return 0;
bad:
	tp_view_free(v);
	return -1;
}

void tp_view_free(tp_view *v)
{
	cJSON_Delete(v->json);
	free(v->e);
	memset(v, 0, sizeof *v);
}

int tp_view_listed(const char *const *l, uint32_t n, const char *s)
{
	for (uint32_t i = 0; s && i < n; i++)
		if (!strcmp(l[i], s))
			return 1;
	return 0;
}

int tp_view_choose(const char *engine, const char *text, size_t len, const char *plan, const char *model_type,
		   const char *quant, tp_view *v, tp_err *e)
{
	if (text) {
		if (tp_view_parse(text, len, engine, v, e) < 0)
			return -1;
		if (v->fragment) {
			tp_fail(e, TP_EINVAL, "%s: '%s' is a fragment (entries views include), not a view", engine, v->name);
			tp_view_free(v);
			return -1;
		}
		if (!tp_view_listed(v->plans, v->nplans, plan)) {
			tp_fail(e, TP_EINVAL, "%s: view '%s' applies to plans other than '%s'", engine, v->name, plan);
			tp_view_free(v);
			return -1;
		}
		if (quant ? !tp_view_listed(v->quant_methods, v->nquant, quant) : v->nquant != 0) {
			tp_fail(e, TP_EINVAL, "%s: view '%s' serves %s checkpoints, not %s%s%s", engine, v->name,
				v->nquant ? "quantized (its quant_methods)" : "unquantized", quant ? "quant_method '" : "",
				quant ? quant : "an unquantized one", quant ? "'" : "");
			tp_view_free(v);
			return -1;
		}
		return 0;
	}
	char known[1024] = "", engines[128] = ","; /* engines: ",vllm,sglang," */
	for (int i = 0; i < tp_view_builtin_count(); i++) {
		size_t l;
		const char *t = tp_view_builtin_text(i, &l);
		tp_view c;
		char origin[64];
		snprintf(origin, sizeof origin, "built-in view %d", i);
		if (tp_view_parse(t, l, origin, &c, e) < 0)
			return -1;
		char pat[40]; /* ",engine,": a whole name of the list */
		tp_fmt(pat, sizeof pat, ",%s,", c.engine);
		size_t el = strlen(engines);
		if (strlen(c.engine) < 32 && !strstr(engines, pat) && el + strlen(pat) < sizeof engines)
			memcpy(engines + el, pat + 1, strlen(pat)); /* "engine," and its NUL */
		if (strcmp(c.engine, engine) != 0 || c.fragment) {
			tp_view_free(&c);
			continue;
		}
		size_t kl = strlen(known);
		tp_fmt(known + kl, sizeof known - kl, "%s%s (%s%s%s)", kl ? "; " : "", c.name, c.plans[0], c.nquant ? ", " : "",
		       c.nquant ? c.quant_methods[0] : "");
		if (tp_view_listed(c.plans, c.nplans, plan) && (!c.nmodel_types || tp_view_listed(c.model_types, c.nmodel_types, model_type)) &&
		    (quant ? tp_view_listed(c.quant_methods, c.nquant, quant) : !c.nquant)) {
			*v = c;
			tp_fmt(v->origin, sizeof v->origin, "built-in %s view '%s'", engine, v->name);
			return 0;
		}
		tp_view_free(&c);
	}
	if (!known[0]) {
		size_t kl = strlen(engines);
		engines[kl - 1] = 0; /* the last comma */
		return tp_fail(e, TP_EINVAL, "--view %s: tpfs has no view for that engine (it has: %s); the default hf "
			       "view (rank folders) serves every planned checkpoint", engine, engines + 1);
	}
	/* the list last: where it fills the message, only its tail is cut, never the hint */
	return tp_fail(e, TP_EINVAL, "--view %s: no %s view for plan '%s' with model_type '%s'%s%s%s; the default hf "
		       "view (rank folders, without --view) serves it (views: %s)", engine, engine, plan,
		       model_type ? model_type : "(none)", quant ? " quantized by quant_method '" : "", quant ? quant : "",
		       quant ? "'" : "", known);
}

#include "views_data.h"

int tp_view_builtin_count(void)
{
	return (int)(sizeof builtin_views / sizeof builtin_views[0]);
}

const char *tp_view_builtin_text(int i, size_t *len)
{
	*len = strlen(builtin_views[i].text);
	return builtin_views[i].text;
}
