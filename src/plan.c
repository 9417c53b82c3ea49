/* plan.c: plan files as data (see plan.h): the split kinds table, parsing and validating a plan
 * file (every field checked, unknown fields refused), extending a plan by a built-in, and
 * name patterns. Resolution against a checkpoint is planner.h's. */
#include "plan.h"
#include "json_strict.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- split kinds ---- */

static const tp_split_kind_def kinds[PL_NKINDS] = {
#define TP_KIND_DEF(id, name, label, ref, comp, lower, needs) [PL_##id] = {name, label, ref, comp, lower, needs},
	TP_SPLIT_KINDS(TP_KIND_DEF)
#undef TP_KIND_DEF
};

const tp_split_kind_def *tp_split_kind(int k)
{
	return k >= 0 && k < PL_NKINDS ? &kinds[k] : NULL;
}

int tp_split_kind_find(const char *name)
{
	for (int k = 0; name && k < PL_NKINDS; k++)
		if (strcmp(name, kinds[k].name) == 0)
			return k;
	return -1;
}

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
		if (!(v->valuedouble <= 9007199254740992.0 && v->valuedouble >= -9007199254740992.0) ||
		    v->valuedouble != (double)(long long)v->valuedouble)
			return tp_fail(e, TP_EINVAL, "%s: rule '%s': '%s' must be an integer of at most 2^53", origin,
				       rname, k);
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
				  "segments", "uneven", "groups", "vocab", "bias", "div", "reason", "comment", NULL};

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
	r->split = tp_split_kind_find(split);
	if (r->split < 0) {
		char list[256] = "";
		for (int k = 0; k < PL_NKINDS; k++) {
			size_t l = strlen(list);
			tp_fmt(list + l, sizeof list - l, "%s%s", k ? ", " : "", kinds[k].name);
		}
		return tp_fail(e, TP_EINVAL, "%s: rule '%s': 'split' must be one of %s", origin, rname, list);
	}
	const tp_split_kind_def *kd = &kinds[r->split];
	const cJSON *ax = cJSON_GetObjectItemCaseSensitive(o, "axis");
	if (kd->needs & TK_NEED_AXIS) {
		if (!cJSON_IsNumber(ax) || !(ax->valuedouble < ST_MAX_DIMS && ax->valuedouble >= -ST_MAX_DIMS) ||
		    ax->valuedouble != (double)(int)ax->valuedouble)
			return tp_fail(e, TP_EINVAL, "%s: rule '%s': split '%s' needs an integer 'axis' (-%d to %d)",
				       origin, rname, kd->name, ST_MAX_DIMS, ST_MAX_DIMS - 1);
		r->axis = (int)ax->valuedouble;
	} else if (ax && kd->ref == TK_AX_HEADS) {
		/* heads_axis: the axis taken when several have the size of 'heads' (the layout the model
		 * code assumes when shapes cannot tell, as transformers' Transpose(check_dims) does) */
		if (!cJSON_IsNumber(ax) || !(ax->valuedouble < ST_MAX_DIMS && ax->valuedouble >= -ST_MAX_DIMS) ||
		    ax->valuedouble != (double)(int)ax->valuedouble)
			return tp_fail(e, TP_EINVAL, "%s: rule '%s': 'axis' of split '%s' must be an integer (-%d to %d)",
				       origin, rname, kd->name, ST_MAX_DIMS, ST_MAX_DIMS - 1);
		r->axis = (int)ax->valuedouble;
		r->axis_pref = 1;
	}
	if (expr_field(o, "heads", &r->heads, origin, rname, e) < 0 ||
	    expr_field(o, "unit", &r->unit, origin, rname, e) < 0 ||
	    expr_field(o, "size", &r->size, origin, rname, e) < 0)
		return -1;
	if (r->heads && r->unit)
		return tp_fail(e, TP_EINVAL, "%s: rule '%s': give 'heads' or 'unit', not both", origin, rname);
	if ((kd->needs & TK_NEED_HEADS) && !r->heads)
		return tp_fail(e, TP_EINVAL, "%s: rule '%s': split '%s' needs 'heads'", origin, rname, kd->name);
	r->reason = str_field(o, "reason");
	if ((kd->needs & TK_NEED_REASON) && !r->reason)
		return tp_fail(e, TP_EINVAL, "%s: rule '%s': split '%s' needs a 'reason' (shown in the refusal)", origin,
			       rname, kd->name);
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
				if (!(s->valuedouble <= 9007199254740992.0 && s->valuedouble >= -9007199254740992.0) ||
				    s->valuedouble != (double)(long long)s->valuedouble)
					return tp_fail(e, TP_EINVAL, "%s: rule '%s': segments must be integers of at most 2^53",
						       origin, rname);
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
		if (!cJSON_IsNumber(div) || !(div->valuedouble >= 1 && div->valuedouble <= 4294967296.0) ||
		    div->valuedouble != (double)(int64_t)div->valuedouble)
			return tp_fail(e, TP_EINVAL, "%s: rule '%s': 'div' must be a positive integer", origin, rname);
		r->div = (int64_t)div->valuedouble;
	}
	return 0;
}

static const char *plan_keys[] = {"tpfs_plan", "name", "description", "detect", "config_prefix", "extends",
				  "per_rank", "rules", "comment", "resolved", "experts", NULL};

static const char *experts_keys[] = {"name", "match", "count", "axis", "comment", NULL};

/* Parses one "experts" declaration. */
static int parse_experts(cJSON *o, int idx, const char *origin, tp_experts *x, tp_err *e)
{
	memset(x, 0, sizeof *x);
	char fallback[32];
	tp_fmt(fallback, sizeof fallback, "#%d", idx);
	if (!cJSON_IsObject(o))
		return tp_fail(e, TP_EINVAL, "%s: experts declaration %s is not an object", origin, fallback);
	x->name = str_field(o, "name");
	if (!x->name) {
		cJSON *n = cJSON_CreateString(fallback);
		if (!n)
			return tp_fail(e, TP_ENOMEM, "%s: out of memory", origin);
		cJSON_AddItemToObject(o, "name", n);
		x->name = n->valuestring;
	}
	const cJSON *k;
	cJSON_ArrayForEach(k, o)
	{
		int known = 0;
		for (int i = 0; experts_keys[i]; i++)
			known |= strcmp(k->string, experts_keys[i]) == 0;
		if (!known)
			return tp_fail(e, TP_EINVAL, "%s: experts '%s': unknown field '%s' (known: name, match, count, axis, comment)",
				       origin, x->name, k->string);
	}
	const cJSON *m = cJSON_GetObjectItemCaseSensitive(o, "match");
	if (cJSON_IsString(m)) {
		x->pat[x->npat++] = m->valuestring;
	} else if (cJSON_IsArray(m)) {
		cJSON_ArrayForEach(k, m)
		{
			if (!cJSON_IsString(k) || x->npat == TP_MAX_PATTERNS)
				return tp_fail(e, TP_EINVAL, "%s: experts '%s': match must hold at most %d strings", origin,
					       x->name, TP_MAX_PATTERNS);
			x->pat[x->npat++] = k->valuestring;
		}
	}
	if (!x->npat)
		return tp_fail(e, TP_EINVAL, "%s: experts '%s': 'match' (a pattern or a list of patterns) is required",
			       origin, x->name);
	if (expr_field(o, "count", &x->count, origin, x->name, e) < 0)
		return -1;
	if (!x->count)
		return tp_fail(e, TP_EINVAL, "%s: experts '%s': 'count' (the number of routed experts, an expression) is required",
			       origin, x->name);
	const cJSON *ax = cJSON_GetObjectItemCaseSensitive(o, "axis");
	if (ax) {
		if (!cJSON_IsNumber(ax) || !(ax->valuedouble < ST_MAX_DIMS && ax->valuedouble >= -ST_MAX_DIMS) ||
		    ax->valuedouble != (double)(int)ax->valuedouble)
			return tp_fail(e, TP_EINVAL, "%s: experts '%s': 'axis' must be an integer (-%d to %d)", origin, x->name,
				       ST_MAX_DIMS, ST_MAX_DIMS - 1);
		x->axis = (int)ax->valuedouble;
	}
	return 0;
}

int tp_plan_parse(const char *text, size_t len, const char *origin, tp_plan *p, tp_err *e)
{
	memset(p, 0, sizeof *p);
	p->json = tp_json_parse(origin, text, len, e); /* as Python's json reads it (json_strict.h) */
	if (!p->json)
		return -1;
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
	cJSON *ex = cJSON_GetObjectItemCaseSensitive(o, "experts");
	if (ex) {
		if (!cJSON_IsArray(ex) || cJSON_GetArraySize(ex) > TP_MAX_EXPERT_DECLS) {
			tp_fail(e, TP_EINVAL, "%s: \"experts\" must be a list of at most %d declarations", origin,
				TP_MAX_EXPERT_DECLS);
			goto bad;
		}
		cJSON_ArrayForEach(r, ex)
		{
			if (parse_experts(r, p->nexperts, origin, &p->experts[p->nexperts], e) < 0)
				goto bad;
			p->nexperts++;
		}
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
	for (int i = 0; i < base->nexperts && p->nexperts < TP_MAX_EXPERT_DECLS; i++)
		p->experts[p->nexperts++] = base->experts[i];
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

