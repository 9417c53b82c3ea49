/* plan.c: plan files, name patterns, and per-tensor resolution (see plan.h).
 *
 * Resolution works on the MODULE a rule names: its reference tensor (`weight`, or
 * `weight_packed`, or the tensor itself when the rule names a bare parameter such as A_log)
 * fixes the split axis and the logical length L of that axis. Every tensor of the module is then
 * cut at the same logical indices: a companion whose axis has S stored elements covers L / S
 * logical features per element (2 for packed FP4, 16 for NVFP4 group scales, 128 for FP8 block
 * scales, with ceil for a partial last block), a companion whose axis has 1 element is
 * broadcast (kept whole), and scalars are replicated. A row-parallel rule keeps 1-D tensors
 * (biases) whole. */
#include "plan.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- parsing ---- */

static const char *str_field(const cJSON *o, const char *k)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
	return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* A string field that may also be given as an integer (expressions like "128" or 128). */
static int expr_field(const cJSON *o, const char *k, const char **out, const char *origin,
		      const char *rname, tp_err *e)
{
	cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
	*out = NULL;
	if (!v)
		return 0;
	if (cJSON_IsNumber(v)) {
		char buf[32];
		tp_fmt(buf, sizeof buf, "%lld", (long long)v->valuedouble);
		cJSON *s = cJSON_CreateString(buf);
		if (!s)
			return tp_fail(e, TP_ENOMEM, "%s: out of memory", origin);
		cJSON_ReplaceItemInObjectCaseSensitive((cJSON *)o, k, s);
		*out = s->valuestring;
		return 0;
	}
	if (!cJSON_IsString(v))
		return tp_fail(e, TP_EINVAL, "%s: rule '%s': '%s' must be a string expression or an integer",
			       origin, rname, k);
	*out = v->valuestring;
	return 0;
}

static int bool_field(const cJSON *o, const char *k, int *out, const char *origin,
		      const char *rname, tp_err *e)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
	*out = 0;
	if (!v)
		return 0;
	if (!cJSON_IsBool(v))
		return tp_fail(e, TP_EINVAL, "%s: rule '%s': '%s' must be true or false", origin, rname, k);
	*out = cJSON_IsTrue(v);
	return 0;
}

static const char *rule_keys[] = {"name", "match", "when", "split", "axis", "heads", "unit", "size",
				  "segments", "uneven", "groups", "vocab", "bias", "div", "comment", NULL};

static int parse_rule(cJSON *o, int idx, const char *origin, tp_rule *r, tp_err *e)
{
	memset(r, 0, sizeof *r);
	r->bias = -1;
	char fallback[32];
	tp_fmt(fallback, sizeof fallback, "#%d", idx);
	if (!cJSON_IsObject(o))
		return tp_fail(e, TP_EINVAL, "%s: rule %s is not an object", origin, fallback);
	r->name = str_field(o, "name");
	const char *rname = r->name ? r->name : fallback;
	if (!r->name) {
		cJSON *n = cJSON_CreateString(fallback);
		cJSON_AddItemToObject(o, "name", n);
		r->name = n->valuestring;
	}
	const cJSON *k;
	cJSON_ArrayForEach(k, o)
	{
		int known = 0;
		for (int i = 0; rule_keys[i]; i++)
			known |= strcmp(k->string, rule_keys[i]) == 0;
		if (!known)
			return tp_fail(e, TP_EINVAL, "%s: rule '%s': unknown field '%s'", origin, rname, k->string);
	}
	const cJSON *m = cJSON_GetObjectItemCaseSensitive(o, "match");
	if (cJSON_IsString(m)) {
		r->pat[r->npat++] = m->valuestring;
	} else if (cJSON_IsArray(m)) {
		cJSON_ArrayForEach(k, m)
		{
			if (!cJSON_IsString(k) || r->npat == TP_MAX_PATTERNS)
				return tp_fail(e, TP_EINVAL, "%s: rule '%s': match must hold at most %d strings",
					       origin, rname, TP_MAX_PATTERNS);
			r->pat[r->npat++] = k->valuestring;
		}
	}
	if (!r->npat)
		return tp_fail(e, TP_EINVAL, "%s: rule '%s': 'match' (a pattern or a list of patterns) is required",
			       origin, rname);
	r->when = str_field(o, "when");
	const char *split = str_field(o, "split");
	static const char *kinds[] = {"replicate", "column", "row", "axis", "heads_axis"};
	r->split = -1;
	for (int i = 0; i < 5 && split; i++)
		if (strcmp(split, kinds[i]) == 0)
			r->split = i;
	if (r->split < 0)
		return tp_fail(e, TP_EINVAL,
			       "%s: rule '%s': 'split' must be one of replicate, column, row, axis, heads_axis",
			       origin, rname);
	const cJSON *ax = cJSON_GetObjectItemCaseSensitive(o, "axis");
	if (r->split == PL_AXIS) {
		if (!cJSON_IsNumber(ax))
			return tp_fail(e, TP_EINVAL, "%s: rule '%s': split 'axis' needs an integer 'axis'",
				       origin, rname);
		r->axis = (int)ax->valuedouble;
	}
	if (expr_field(o, "heads", &r->heads, origin, rname, e) < 0 ||
	    expr_field(o, "unit", &r->unit, origin, rname, e) < 0 ||
	    expr_field(o, "size", &r->size, origin, rname, e) < 0)
		return -1;
	if (r->heads && r->unit)
		return tp_fail(e, TP_EINVAL, "%s: rule '%s': give 'heads' or 'unit', not both", origin, rname);
	if (r->split == PL_HEADS_AXIS && !r->heads)
		return tp_fail(e, TP_EINVAL, "%s: rule '%s': split 'heads_axis' needs 'heads'", origin, rname);
	cJSON *segs = cJSON_GetObjectItemCaseSensitive(o, "segments");
	if (segs) {
		if (!cJSON_IsArray(segs) || cJSON_GetArraySize(segs) < 1 || cJSON_GetArraySize(segs) > TP_MAX_SEG)
			return tp_fail(e, TP_EINVAL, "%s: rule '%s': 'segments' must be a list of 1 to %d expressions",
				       origin, rname, TP_MAX_SEG);
		cJSON *s;
		cJSON_ArrayForEach(s, segs)
		{
			if (cJSON_IsNumber(s)) {
				char buf[32];
				tp_fmt(buf, sizeof buf, "%lld", (long long)s->valuedouble);
				cJSON *ns = cJSON_CreateString(buf);
				cJSON_ReplaceItemViaPointer(segs, s, ns);
				s = ns;
			}
			int k = r->nseg++;
			if (cJSON_IsObject(s)) {
				if (expr_field(s, "size", &r->seg[k], origin, rname, e) < 0 ||
				    expr_field(s, "heads", &r->seg_heads[k], origin, rname, e) < 0 ||
				    expr_field(s, "unit", &r->seg_unit[k], origin, rname, e) < 0)
					return -1;
				if (!r->seg[k] || (r->seg_heads[k] && r->seg_unit[k]))
					return tp_fail(e, TP_EINVAL,
						       "%s: rule '%s': a segment object needs \"size\" and at most one of \"heads\", \"unit\"",
						       origin, rname);
			} else if (cJSON_IsString(s)) {
				r->seg[k] = s->valuestring;
			} else {
				return tp_fail(e, TP_EINVAL, "%s: rule '%s': segments must be expressions or objects", origin, rname);
			}
		}
	}
	if (bool_field(o, "uneven", &r->uneven, origin, rname, e) < 0 ||
	    bool_field(o, "groups", &r->groups, origin, rname, e) < 0 ||
	    bool_field(o, "vocab", &r->vocab, origin, rname, e) < 0)
		return -1;
	const char *bias = str_field(o, "bias");
	if (bias) {
		if (strcmp(bias, "split") && strcmp(bias, "replicate"))
			return tp_fail(e, TP_EINVAL, "%s: rule '%s': 'bias' must be split or replicate", origin, rname);
		r->bias = strcmp(bias, "split") == 0;
	}
	const cJSON *div = cJSON_GetObjectItemCaseSensitive(o, "div");
	if (div) {
		if (!cJSON_IsNumber(div) || div->valuedouble < 1)
			return tp_fail(e, TP_EINVAL, "%s: rule '%s': 'div' must be a positive integer", origin, rname);
		r->div = (int64_t)div->valuedouble;
	}
	return 0;
}

static const char *plan_keys[] = {"tpfs_plan", "name", "description", "detect", "config_prefix", "extends",
				  "per_rank", "rules", "comment", "resolved", NULL};

int tp_plan_parse(const char *text, size_t len, const char *origin, tp_plan *p, tp_err *e)
{
	memset(p, 0, sizeof *p);
	p->json = cJSON_ParseWithLength(text, len);
	if (!p->json)
		return tp_fail(e, TP_EINVAL, "%s: not valid JSON (near byte %ld)", origin,
			       cJSON_GetErrorPtr() ? (long)(cJSON_GetErrorPtr() - text) : 0L);
	cJSON *o = p->json;
	if (!cJSON_IsObject(o)) {
		tp_plan_free(p);
		return tp_fail(e, TP_EINVAL, "%s: a plan file is a JSON object", origin);
	}
	const cJSON *k;
	cJSON_ArrayForEach(k, o)
	{
		int known = 0;
		for (int i = 0; plan_keys[i]; i++)
			known |= strcmp(k->string, plan_keys[i]) == 0;
		if (!known) {
			tp_fail(e, TP_EINVAL, "%s: unknown field '%s'", origin, k->string);
			goto bad;
		}
	}
	const cJSON *ver = cJSON_GetObjectItemCaseSensitive(o, "tpfs_plan");
	if (!cJSON_IsNumber(ver) || ver->valuedouble != 1) {
		tp_fail(e, TP_EINVAL, "%s: \"tpfs_plan\": 1 is required (the plan format version)", origin);
		goto bad;
	}
	p->name = str_field(o, "name");
	if (!p->name) {
		tp_fail(e, TP_EINVAL, "%s: \"name\" is required", origin);
		goto bad;
	}
	p->description = str_field(o, "description");
	p->extends = str_field(o, "extends");
	const cJSON *pre = cJSON_GetObjectItemCaseSensitive(o, "config_prefix");
	cJSON_ArrayForEach(k, pre)
	{
		if (cJSON_IsString(k) && p->nprefix < TP_EXPR_MAX_PREFIX)
			p->prefix[p->nprefix++] = k->valuestring;
	}
	cJSON *rules = cJSON_GetObjectItemCaseSensitive(o, "rules");
	if (!cJSON_IsArray(rules)) {
		tp_fail(e, TP_EINVAL, "%s: \"rules\" (a list) is required", origin);
		goto bad;
	}
	int n = cJSON_GetArraySize(rules);
	p->rules = calloc(n ? (size_t)n : 1, sizeof *p->rules);
	if (!p->rules) {
		tp_fail(e, TP_ENOMEM, "%s: out of memory", origin);
		goto bad;
	}
	cJSON *r;
	cJSON_ArrayForEach(r, rules)
	{
		if (parse_rule(r, p->nrules, origin, &p->rules[p->nrules], e) < 0)
			goto bad;
		p->nrules++;
	}
	const cJSON *pr = cJSON_GetObjectItemCaseSensitive(o, "per_rank");
	if (pr) {
		int m = cJSON_GetArraySize(pr);
		p->per_rank = calloc(m ? (size_t)m : 1, sizeof *p->per_rank);
		cJSON_ArrayForEach(k, pr)
		{
			const char *key = str_field(k, "key");
			if (!key) {
				tp_fail(e, TP_EINVAL, "%s: per_rank entries need a \"key\"", origin);
				goto bad;
			}
			tp_per_rank *q = &p->per_rank[p->nper_rank++];
			q->key = key;
			if (bool_field(k, "uneven", &q->uneven, origin, key, e) < 0 ||
			    bool_field(k, "groups", &q->groups, origin, key, e) < 0 ||
			    bool_field(k, "vocab", &q->vocab, origin, key, e) < 0)
				goto bad;
			q->value = str_field(k, "value");
		}
	}
	return 0;
bad:
	tp_plan_free(p);
	return -1;
}

void tp_plan_free(tp_plan *p)
{
	free(p->rules);
	free(p->per_rank);
	cJSON_Delete(p->json);
	for (int i = 0; i < p->nbase; i++)
		cJSON_Delete(p->base[i]);
	memset(p, 0, sizeof *p);
}

int tp_plan_extend(tp_plan *p, tp_plan *base, tp_err *e)
{
	if (p->nbase + 1 + base->nbase > 4) {
		tp_plan_free(base);
		return tp_fail(e, TP_ELIMIT, "plan '%s': extends more than 4 plans deep", p->name);
	}
	tp_rule *r = realloc(p->rules, (size_t)(p->nrules + base->nrules + 1) * sizeof *r);
	if (!r) {
		tp_plan_free(base);
		return tp_fail(e, TP_ENOMEM, "out of memory extending plan '%s'", p->name);
	}
	memcpy(r + p->nrules, base->rules, (size_t)base->nrules * sizeof *r);
	p->rules = r;
	p->nrules += base->nrules;
	if (!p->nprefix) {
		memcpy(p->prefix, base->prefix, sizeof p->prefix);
		p->nprefix = base->nprefix;
	}
	if (!p->nper_rank && base->nper_rank) {
		free(p->per_rank);
		p->per_rank = base->per_rank;
		p->nper_rank = base->nper_rank;
		base->per_rank = NULL;
	}
	p->base[p->nbase++] = base->json;
	for (int i = 0; i < base->nbase; i++)
		p->base[p->nbase++] = base->base[i];
	base->json = NULL;
	base->nbase = 0;
	tp_plan_free(base);
	return 0;
}

int tp_plan_builtin(const char *name, tp_plan *p, tp_err *e)
{
	int depth = 0;
	const char *want = name;
	tp_plan cur;
	memset(p, 0, sizeof *p);
	/* load the chain top-down, then fold each base into the plan above it */
	tp_plan chain[5];
	int n = 0;
	while (want) {
		int i = tp_builtin_find(want);
		if (i < 0 || depth == 5) {
			for (int k = 0; k < n; k++)
				tp_plan_free(&chain[k]);
			return tp_fail(e, TP_EINVAL, "plan '%s' extends '%s', which is not a built-in plan", name, want);
		}
		size_t len;
		const char *text = tp_builtin_text(i, &len);
		char origin[128];
		tp_fmt(origin, sizeof origin, "built-in plan %s", want);
		if (tp_plan_parse(text, len, origin, &cur, e) < 0) {
			for (int k = 0; k < n; k++)
				tp_plan_free(&chain[k]);
			return -1;
		}
		chain[n++] = cur;
		want = cur.extends;
		depth++;
	}
	for (int k = n - 1; k > 0; k--)
		if (tp_plan_extend(&chain[k - 1], &chain[k], e) < 0) {
			for (int j = 0; j < k; j++)
				tp_plan_free(&chain[j]);
			return -1;
		}
	*p = chain[0];
	return 0;
}

/* ---- patterns ---- */

#define MAX_COMP 64

typedef struct comps {
	const char *s[MAX_COMP];
	size_t l[MAX_COMP];
	int n;
} comps;

static int split_comps(const char *name, comps *c)
{
	c->n = 0;
	const char *p = name;
	for (;;) {
		if (c->n == MAX_COMP)
			return -1;
		const char *dot = strchr(p, '.');
		c->s[c->n] = p;
		c->l[c->n] = dot ? (size_t)(dot - p) : strlen(p);
		c->n++;
		if (!dot)
			return 0;
		p = dot + 1;
	}
}

/* Glob match of one component: '*' matches any run of characters; "{v}" alone matches an
 * integer and binds v. */
static int comp_match(const char *p, size_t pl, const char *s, size_t sl, tp_expr_ctx *cfg)
{
	if (pl >= 3 && p[0] == '{' && p[pl - 1] == '}') {
		if (!sl || sl > 9)
			return 0;
		int64_t v = 0;
		for (size_t i = 0; i < sl; i++) {
			if (s[i] < '0' || s[i] > '9')
				return 0;
			v = v * 10 + (s[i] - '0');
		}
		if (cfg) {
			char var[16];
			tp_fmt(var, sizeof var, "%.*s", (int)(pl - 2), p + 1);
			tp_expr_bind(cfg, var, v);
		}
		return 1;
	}
	/* iterative glob with backtracking to the last '*' */
	size_t pi = 0, si = 0, star = (size_t)-1, mark = 0;
	while (si < sl) {
		if (pi < pl && p[pi] == '*') {
			star = pi++;
			mark = si;
		} else if (pi < pl && p[pi] == s[si]) {
			pi++;
			si++;
		} else if (star != (size_t)-1) {
			pi = star + 1;
			si = ++mark;
		} else {
			return 0;
		}
	}
	while (pi < pl && p[pi] == '*')
		pi++;
	return pi == pl;
}

/* Matches pattern components [pi..) against name components [ni..). Returns the number of name
 * components the pattern covers, or -1. At most one component may follow (the role), unless
 * the pattern ends in "**". */
static int match_from(const comps *pc, int pi, const comps *nc, int ni, tp_expr_ctx *cfg)
{
	if (pi == pc->n)
		return nc->n - ni <= 1 ? ni : -1;
	if (pc->l[pi] == 2 && memcmp(pc->s[pi], "**", 2) == 0) {
		if (pi + 1 == pc->n)
			return nc->n;
		for (int k = ni; k <= nc->n; k++) {
			int r = match_from(pc, pi + 1, nc, k, cfg);
			if (r >= 0)
				return r;
		}
		return -1;
	}
	if (ni < nc->n && comp_match(pc->s[pi], pc->l[pi], nc->s[ni], nc->l[ni], cfg))
		return match_from(pc, pi + 1, nc, ni + 1, cfg);
	return -1;
}

int tp_pattern_match(const char *pat, const char *name, tp_expr_ctx *cfg)
{
	comps pc, nc;
	if (split_comps(pat, &pc) < 0 || split_comps(name, &nc) < 0)
		return -1;
	int k = match_from(&pc, 0, &nc, 0, cfg);
	if (k < 0)
		return -1;
	if (k == 0)
		return 0;
	return (int)(nc.s[k - 1] - name + (ptrdiff_t)nc.l[k - 1]);
}

/* ---- resolution ---- */

static int is_scalar(const st_tensor *t)
{
	return st_numel(t) == 1;
}

/* Evaluates an expression that must be a positive integer. */
static int eval_pos(tp_expr_ctx *cfg, const char *src, int64_t *v, const char *what, const char *ctx,
		    const tp_rule *r, tp_err *e)
{
	int rc = tp_expr_int(cfg, src, v, e);
	if (rc == 0 && *v <= 0)
		rc = tp_fail(e, TP_EPLAN, "expression '%s' is %lld, not positive", src, (long long)*v);
	if (rc != 0) {
		tp_err_prefix(e, "%s (rule '%s', %s)", ctx, r->name, what);
		return -1;
	}
	return 0;
}

/* The block size the config gives for an axis of a block-quantized weight (FP8
 * weight_block_size [n, k]); 0 if none. */
static int64_t config_block(tp_expr_ctx *cfg, int last_axis)
{
	const cJSON *q = tp_config_get(cfg, "quantization_config.weight_block_size");
	if (!cJSON_IsArray(q) || cJSON_GetArraySize(q) != 2)
		return 0;
	const cJSON *v = cJSON_GetArrayItem(q, last_axis ? 1 : 0);
	return cJSON_IsNumber(v) && v->valuedouble >= 1 ? (int64_t)v->valuedouble : 0;
}

/* The NVFP4 group size the config gives (quantization_config.group_size, or the weights of the
 * first compressed-tensors config group); 16, NVFP4's, when it gives none. */
static int64_t config_group(tp_expr_ctx *cfg)
{
	const cJSON *q = tp_config_get(cfg, "quantization_config.group_size");
	if (cJSON_IsNumber(q) && q->valuedouble >= 1)
		return (int64_t)q->valuedouble;
	const cJSON *groups = tp_config_get(cfg, "quantization_config.config_groups"), *g;
	cJSON_ArrayForEach(g, groups)
	{
		const cJSON *w = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(g, "weights"), "group_size");
		if (cJSON_IsNumber(w) && w->valuedouble >= 1)
			return (int64_t)w->valuedouble;
	}
	return 16;
}

/* Is the module's reference weight packed FP4 (two values per U8 along the last axis)? NVFP4
 * (ModelOpt and compressed-tensors) stores it as U8 next to an F8_E4M3 weight_scale. */
static int packed_fp4(const st_tensor *ref, const char *module, tp_lookup_fn lookup, void *lctx)
{
	if (ref->dtype != ST_U8 && ref->dtype != ST_I8)
		return 0;
	char nm[ST_MAX_NAME + 32];
	tp_fmt(nm, sizeof nm, "%s.weight_scale", module);
	const st_tensor *s = lookup(lctx, nm);
	return s && s->dtype == ST_F8_E4M3 && s->ndim == ref->ndim && ref->ndim >= 1;
}

static int resolve_axis(const tp_rule *r, const st_tensor *t, int64_t heads, const char *ctx, tp_err *e)
{
	switch (r->split) {
	case PL_COLUMN:
		return t->ndim >= 1 ? 0 : tp_fail(e, TP_EPLAN, "%s (rule '%s'): a scalar has no dim 0 to split", ctx, r->name);
	case PL_ROW:
		return t->ndim >= 1 ? (int)t->ndim - 1
				    : tp_fail(e, TP_EPLAN, "%s (rule '%s'): a scalar has no last dim to split", ctx, r->name);
	case PL_AXIS: {
		int a = r->axis < 0 ? (int)t->ndim + r->axis : r->axis;
		if (a < 0 || a >= (int)t->ndim)
			return tp_fail(e, TP_EPLAN, "%s (rule '%s'): axis %d is out of range for %u dimensions", ctx,
				       r->name, r->axis, t->ndim);
		return a;
	}
	default: { /* PL_HEADS_AXIS: the one axis whose size is the head count */
		int found = -1, count = 0;
		for (uint32_t i = 0; i < t->ndim; i++)
			if (t->shape[i] == (uint64_t)heads) {
				found = (int)i;
				count++;
			}
		if (count != 1)
			return tp_fail(e, TP_EPLAN, "%s (rule '%s'): %s axis has size %lld (heads) in shape of %u dimensions",
				       ctx, r->name, count ? "more than one" : "no", (long long)heads, t->ndim);
		return found;
	}
	}
}

int tp_plan_resolve(const tp_plan *pl, tp_expr_ctx *cfg, const st_tensor *t, tp_lookup_fn lookup,
		    void *lctx, const tp_resolve_opts *o, const char *ctx, tp_resolved *out, tp_err *e)
{
	memset(out, 0, sizeof *out);
	out->spec = tp_spec_replicate();
	out->rule = -1;
	char tctx[TP_ERR_MSG];
	tp_fmt(tctx, sizeof tctx, "%s: tensor '%s'", ctx, t->name);

	const tp_rule *r = NULL;
	int plen = -1;
	for (int i = 0; i < pl->nrules && !r; i++) {
		for (int k = 0; k < pl->rules[i].npat && !r; k++) {
			cfg->nvar = 0;
			tp_expr_bind(cfg, "T", o->T);
			plen = tp_pattern_match(pl->rules[i].pat[k], t->name, cfg);
			if (plen < 0)
				continue;
			if (pl->rules[i].when) {
				int c = tp_expr_cond(cfg, pl->rules[i].when, e);
				if (c < 0) {
					tp_err_prefix(e, "%s (rule '%s', when)", tctx, pl->rules[i].name);
					return -1;
				}
				if (!c)
					continue;
			}
			r = &pl->rules[i];
			out->rule = i;
		}
	}
	if (!r) {
		tp_fmt(out->why, sizeof out->why, "replicate (no rule matched)");
		return 0;
	}
	if (r->split == PL_REPLICATE) {
		tp_fmt(out->why, sizeof out->why, "replicate");
		return 0;
	}
	if (is_scalar(t) && r->div == 0) {
		tp_fmt(out->why, sizeof out->why, "replicate (scalar)");
		return 0;
	}

	/* The module and its reference tensor. */
	char module[ST_MAX_NAME + 1];
	tp_fmt(module, sizeof module, "%.*s", plen, t->name);
	const char *role = t->name[plen] == '.' ? t->name + plen + 1 : "";
	const st_tensor *ref = t;
	if (*role) {
		static const char *refs[] = {"weight", "weight_packed", "qweight"};
		for (int i = 0; i < 3; i++) {
			char nm[ST_MAX_NAME + 32];
			tp_fmt(nm, sizeof nm, "%s.%s", module, refs[i]);
			const st_tensor *c = lookup(lctx, nm);
			if (c) {
				ref = c;
				break;
			}
		}
	}

	int64_t heads = 0;
	if (r->heads && eval_pos(cfg, r->heads, &heads, "heads", tctx, r, e) < 0)
		return -1;
	int axis_ref = resolve_axis(r, ref, heads, tctx, e);
	if (axis_ref < 0)
		return -1;
	uint64_t S_ref = ref->shape[axis_ref];
	int packed = packed_fp4(ref, module, lookup, lctx) && axis_ref == (int)ref->ndim - 1;
	uint64_t L = packed ? 2 * S_ref : S_ref;
	if (r->div) {
		/* an explicit divisor (resolved plans): size gives L, default S * div */
		int64_t sz = (int64_t)(S_ref * (uint64_t)r->div);
		if (r->size && eval_pos(cfg, r->size, &sz, "size", tctx, r, e) < 0)
			return -1;
		L = (uint64_t)sz;
	} else if (r->size) {
		int64_t sz;
		if (eval_pos(cfg, r->size, &sz, "size", tctx, r, e) < 0)
			return -1;
		if ((uint64_t)sz != L)
			return tp_fail(e, TP_EPLAN,
				       "%s (rule '%s'): axis %d of '%s' holds %llu features but '%s' = %lld (%s)",
				       tctx, r->name, axis_ref, ref->name, (unsigned long long)L, r->size,
				       (long long)sz, cfg->used[0] ? cfg->used : "no config keys");
	}

	/* Units and segments, in logical features. */
	int64_t unit = 1;
	if (r->heads) {
		if (L % (uint64_t)heads)
			return tp_fail(e, TP_EPLAN,
				       "%s (rule '%s'): axis %d of '%s' holds %llu features, not a multiple of %lld heads ('%s'; %s)",
				       tctx, r->name, axis_ref, ref->name, (unsigned long long)L, (long long)heads,
				       r->heads, cfg->used[0] ? cfg->used : "no config keys");
		unit = (int64_t)(L / (uint64_t)heads);
	} else if (r->unit && eval_pos(cfg, r->unit, &unit, "unit", tctx, r, e) < 0) {
		return -1;
	}
	tp_spec s = tp_spec_replicate();
	s.kind = TP_SPLIT;
	s.unit = (uint64_t)unit;
	s.flags = (r->uneven ? TP_UNEVEN : 0) | (r->groups ? TP_GROUPS : 0);
	if (r->nseg) {
		uint64_t sum = 0;
		for (int i = 0; i < r->nseg; i++) {
			int64_t v, u = unit;
			if (eval_pos(cfg, r->seg[i], &v, "segments", tctx, r, e) < 0)
				return -1;
			if (r->seg_heads[i]) {
				int64_t h;
				if (eval_pos(cfg, r->seg_heads[i], &h, "segment heads", tctx, r, e) < 0)
					return -1;
				if (v % h)
					return tp_fail(e, TP_EPLAN,
						       "%s (rule '%s'): segment %d ('%s' = %lld) is not a multiple of %lld heads ('%s')",
						       tctx, r->name, i, r->seg[i], (long long)v, (long long)h, r->seg_heads[i]);
				u = v / h;
			} else if (r->seg_unit[i] && eval_pos(cfg, r->seg_unit[i], &u, "segment unit", tctx, r, e) < 0) {
				return -1;
			}
			if (v % u)
				return tp_fail(e, TP_EPLAN,
					       "%s (rule '%s'): segment %d ('%s' = %lld) is not a whole number of units of %lld",
					       tctx, r->name, i, r->seg[i], (long long)v, (long long)u);
			s.seg[i] = (uint64_t)(v / u);
			s.segu[i] = u == unit ? 0 : (uint64_t)u;
			sum += (uint64_t)v;
		}
		s.nseg = (uint32_t)r->nseg;
		if (sum != L)
			return tp_fail(e, TP_EPLAN,
				       "%s (rule '%s'): segments sum to %llu but axis %d of '%s' holds %llu features",
				       tctx, r->name, (unsigned long long)sum, axis_ref, ref->name,
				       (unsigned long long)L);
	} else {
		if (L % (uint64_t)unit)
			return tp_fail(e, TP_EPLAN,
				       "%s (rule '%s'): axis %d of '%s' holds %llu features, not a multiple of the unit %lld",
				       tctx, r->name, axis_ref, ref->name, (unsigned long long)L, (long long)unit);
		s.nseg = 1;
		s.seg[0] = L / (uint64_t)unit;
	}
	if (r->vocab) {
		if (o->pad_vocab > 1) {
			s.pad_to = o->pad_vocab;
		} else if (L / (uint64_t)unit % o->T) {
			uint64_t rows = L / (uint64_t)unit, padded = (rows + 63) / 64 * 64;
			return tp_fail(e, TP_EPLAN, "%s (rule '%s'): the vocabulary of %llu rows does not divide over %u ranks%s",
				       tctx, r->name, (unsigned long long)rows, o->T,
				       padded % o->T ? " (nor does it padded to a multiple of 64: choose another T)"
						     : "; pass --pad-vocab to pad it to a multiple of 64 as vLLM does");
		}
	}
	out->logical = L;

	/* This tensor's axis and divisor. */
	int axis = axis_ref;
	if (t != ref) {
		if (r->split == PL_ROW || (r->split != PL_COLUMN && t->ndim != ref->ndim)) {
			if (t->ndim < 2 && !(r->bias == 1)) {
				tp_fmt(out->why, sizeof out->why, "replicate (1-D companion of a %s split)",
				       r->split == PL_ROW ? "row-parallel" : "non-column");
				return 0;
			}
			axis = r->split == PL_ROW ? (int)t->ndim - 1 : axis_ref;
			if (axis >= (int)t->ndim)
				return tp_fail(e, TP_EPLAN, "%s (rule '%s'): has %u dimensions, its module's weight %u",
					       tctx, r->name, t->ndim, ref->ndim);
		} else {
			axis = r->split == PL_COLUMN ? 0 : axis_ref;
		}
		if (r->bias == 0 && t->ndim == 1) {
			tp_fmt(out->why, sizeof out->why, "replicate (bias kept whole by the rule)");
			return 0;
		}
	}
	uint64_t S = t->shape[axis];
	uint64_t div = 1;
	int last = axis == (int)t->ndim - 1 && t->ndim > 1;
	if (r->div) {
		div = (uint64_t)r->div;
	} else if (t == ref) {
		div = packed ? 2 : 1;
	} else if (!strcmp(role, "weight_scale_inv")) {
		/* FP8 block scales: one element per block of the config's block size (ceil for a
		 * partial last block); never a broadcast, even when one block covers the axis */
		int64_t b = config_block(cfg, last);
		if (b > 0 && S != (L + (uint64_t)b - 1) / (uint64_t)b)
			return tp_fail(e, TP_EPLAN,
				       "%s (rule '%s'): axis %d has %llu blocks but ceil(%llu / %lld) = %llu "
				       "(quantization_config.weight_block_size)",
				       tctx, r->name, axis, (unsigned long long)S, (unsigned long long)L, (long long)b,
				       (unsigned long long)((L + (uint64_t)b - 1) / (uint64_t)b));
		if (b > 0)
			div = (uint64_t)b;
		else if (S && L % S == 0)
			div = L / S;
		else
			return tp_fail(e, TP_EPLAN,
				       "%s (rule '%s'): axis %d has %llu blocks for %llu features and config.json gives no "
				       "quantization_config.weight_block_size",
				       tctx, r->name, axis, (unsigned long long)S, (unsigned long long)L);
	} else if (packed && last && !strcmp(role, "weight_scale") && t->dtype == ST_F8_E4M3) {
		/* NVFP4 group scales: one FP8 scale per group of the config's group size along K */
		int64_t g = config_group(cfg);
		if (S * (uint64_t)g != L)
			return tp_fail(e, TP_EPLAN,
				       "%s (rule '%s'): axis %d has %llu group scales but %llu features in groups of %lld need %llu",
				       tctx, r->name, axis, (unsigned long long)S, (unsigned long long)L, (long long)g,
				       (unsigned long long)(L / (uint64_t)g));
		div = (uint64_t)g;
	} else if (S == L) {
		div = 1;
	} else if (S == 1) {
		tp_fmt(out->why, sizeof out->why, "replicate (broadcast along the split axis)");
		return 0;
	} else if (S && L % S == 0) {
		div = L / S;
	} else {
		int64_t b = config_block(cfg, last);
		if (b > 0 && (L + (uint64_t)b - 1) / (uint64_t)b == S)
			div = (uint64_t)b;
		else
			return tp_fail(e, TP_EPLAN,
				       "%s (rule '%s'): axis %d has %llu elements, which do not relate to the %llu features of '%s' "
				       "(neither equal, a divisor, nor ceil(%llu / block) for the config's block size)",
				       tctx, r->name, axis, (unsigned long long)S, (unsigned long long)L, ref->name,
				       (unsigned long long)L);
	}
	s.axis = (uint32_t)axis;
	s.div = div;
	out->spec = s;
	static const char *kn[] = {"replicate", "column", "row", "axis", "heads"};
	int w = 0;
	char buf[160];
	w = snprintf(buf, sizeof buf, "%s", kn[r->split]);
	if (r->split == PL_AXIS || r->split == PL_HEADS_AXIS)
		w += snprintf(buf + w, sizeof buf - (size_t)w, " axis %d", axis);
	if (s.nseg > 1) {
		w += snprintf(buf + w, sizeof buf - (size_t)w, ", segments");
		for (uint32_t i = 0; i < s.nseg && w < 100; i++)
			w += snprintf(buf + w, sizeof buf - (size_t)w, "%s%llux%llu", i ? "|" : " ", (unsigned long long)s.seg[i],
				      (unsigned long long)(s.segu[i] ? s.segu[i] : s.unit));
	} else {
		w += snprintf(buf + w, sizeof buf - (size_t)w, ", %llu %s of %llu", (unsigned long long)s.seg[0],
			      r->heads ? "heads" : "units", (unsigned long long)s.unit);
	}
	if (div > 1 && w < 140)
		w += snprintf(buf + w, sizeof buf - (size_t)w, ", %llu per element", (unsigned long long)div);
	if (s.pad_to && w < 140)
		w += snprintf(buf + w, sizeof buf - (size_t)w, ", padded to %llu", (unsigned long long)s.pad_to);
	if (s.flags & TP_UNEVEN && w < 150)
		w += snprintf(buf + w, sizeof buf - (size_t)w, ", uneven");
	if (s.flags & TP_GROUPS && w < 150)
		snprintf(buf + w, sizeof buf - (size_t)w, ", groups");
	memcpy(out->why, buf, sizeof out->why);
	return 0;
}
