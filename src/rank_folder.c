/* rank_folder.c: the resolved plan's digest, rank metadata and per-rank config.json (see
 * rank_folder.h). */
#include "rank_folder.h"

#include <cjson/cJSON.h>
#include <fcntl.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "rank_config.h"
#include "sha256.h"

/* ---- the resolved plan's text ---- */

static void t_add(tp_text *b, const char *s, size_t n)
{
	if (b->oom)
		return;
	if (b->len + n + 1 > b->cap) {
		size_t cap = b->cap ? b->cap : 256;
		while (b->len + n + 1 > cap)
			cap *= 2;
		char *p = realloc(b->p, cap);
		if (!p) {
			b->oom = 1;
			return;
		}
		b->p = p;
		b->cap = cap;
	}
	memcpy(b->p + b->len, s, n);
	b->len += n;
	b->p[b->len] = 0;
}

static void t_str(tp_text *b, const char *s)
{
	t_add(b, s, strlen(s));
}

/* A JSON string as cJSON prints it: quote, backslash and the control characters escaped
 * (\b \f \n \r \t, others \u00xx), every other byte as it is. */
static void t_json_string(tp_text *b, const char *s)
{
	t_add(b, "\"", 1);
	const char *run = s;
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;
		if (c >= 32 && c != '"' && c != '\\')
			continue;
		t_add(b, run, (size_t)(s - run));
		run = s + 1;
		char esc[8];
		switch (c) {
		case '"': t_add(b, "\\\"", 2); break;
		case '\\': t_add(b, "\\\\", 2); break;
		case '\b': t_add(b, "\\b", 2); break;
		case '\f': t_add(b, "\\f", 2); break;
		case '\n': t_add(b, "\\n", 2); break;
		case '\r': t_add(b, "\\r", 2); break;
		case '\t': t_add(b, "\\t", 2); break;
		default:
			snprintf(esc, sizeof esc, "\\u%04x", c);
			t_add(b, esc, 6);
		}
	}
	t_add(b, run, (size_t)(s - run));
	t_add(b, "\"", 1);
}

/* A number as cJSON prints one: "%d" when it equals its int (saturated) value, else "%1.15g",
 * or "%1.17g" when that does not read back (cJSON's print_number). */
static void t_num(tp_text *b, double d)
{
	char s[40];
	int vi = d >= INT_MAX ? INT_MAX : d <= (double)INT_MIN ? INT_MIN : (int)d;
	if (d == (double)vi) {
		snprintf(s, sizeof s, "%d", vi);
	} else {
		snprintf(s, sizeof s, "%1.15g", d);
		double back;
		double big = fabs(back = strtod(s, NULL)) > fabs(d) ? fabs(back) : fabs(d);
		if (!(fabs(back - d) <= big * DBL_EPSILON))
			snprintf(s, sizeof s, "%1.17g", d);
	}
	t_str(b, s);
}

static void t_member(tp_text *b, const char *key, double v)
{
	t_add(b, ",\"", 2);
	t_str(b, key);
	t_add(b, "\":", 2);
	t_num(b, v);
}

void tp_resolved_rule(tp_text *b, const tp_plan *pl, const st_tensor *t, const tp_resolved *res)
{
	const tp_spec *s = &res->spec;
	if (res->rule == TP_RULE_EXPERTS)
		return; /* placed by the experts declarations (--ep), not by a rule */
	t_str(b, "{\"match\":");
	t_json_string(b, t->name);
	if (s->kind != TP_SPLIT) {
		t_str(b, ",\"split\":\"replicate\"}");
		return;
	}
	t_str(b, ",\"split\":\"axis\"");
	t_member(b, "axis", s->axis);
	t_member(b, "unit", (double)s->unit);
	t_member(b, "size", (double)res->logical);
	t_member(b, "div", (double)s->div);
	if (s->nseg > 1) {
		t_str(b, ",\"segments\":[");
		for (uint32_t k = 0; k < s->nseg; k++) {
			uint64_t u = s->segu[k] ? s->segu[k] : s->unit;
			t_str(b, k ? ",{\"size\":" : "{\"size\":");
			t_num(b, (double)(s->seg[k] * u));
			t_member(b, "unit", (double)u);
			t_add(b, "}", 1);
		}
		t_add(b, "]", 1);
	}
	if (s->flags & TP_UNEVEN)
		t_str(b, ",\"uneven\":true");
	if (s->flags & TP_GROUPS)
		t_str(b, ",\"groups\":true");
	if (res->rule >= 0 && pl->rules[res->rule].vocab)
		t_str(b, ",\"vocab\":true");
	t_add(b, "}", 1);
}

void tp_resolved_keep(tp_rank_folder *rf, uint32_t nn, uint32_t idx, const st_header *h, tp_text *b, tp_span *sp)
{
	if (!rf->resolved) {
		rf->resolved = calloc(nn, sizeof *rf->resolved);
		rf->nresolved = rf->resolved ? nn : 0;
	}
	tp_text block = {0};
	int ok = rf->resolved && !b->oom;
	for (size_t k = h->n; ok && k-- > 0;) {
		const tp_span *s = &sp[h->by_name[k]];
		if (s->a == SIZE_MAX) {
			ok = 0; /* a rule is missing: no digest */
			break;
		}
		if (s->b == s->a)
			continue; /* a routed expert under --ep */
		if (block.len)
			t_add(&block, ",", 1);
		t_add(&block, b->p + s->a, s->b - s->a);
	}
	free(b->p);
	free(sp);
	if (!ok || block.oom) {
		free(block.p);
		rf->resolved_failed = 1;
		return;
	}
	rf->resolved[idx] = block.p ? block.p : strdup("");
	if (!rf->resolved[idx])
		rf->resolved_failed = 1;
}

cJSON *tp_experts_json(const tp_plan *pl)
{
	cJSON *xs = cJSON_CreateArray();
	for (int d = 0; xs && d < pl->nexperts; d++) {
		const tp_experts *x = &pl->experts[d];
		cJSON *xo = cJSON_CreateObject();
		cJSON_AddStringToObject(xo, "name", x->name);
		cJSON_AddItemToObject(xo, "match", cJSON_CreateStringArray(x->pat, x->npat));
		cJSON_AddStringToObject(xo, "count", x->count);
		if (x->axis)
			cJSON_AddNumberToObject(xo, "axis", x->axis);
		cJSON_AddItemToArray(xs, xo);
	}
	return xs;
}

char *tp_resolved_plan_text(tp_rank_folder *rf, const tp_plan *pl, int ep)
{
	cJSON *pr = cJSON_CreateArray();
	for (int i = 0; pr && i < pl->nper_rank; i++) {
		const tp_per_rank *p = &pl->per_rank[i];
		cJSON *q = cJSON_CreateObject();
		cJSON_AddStringToObject(q, "key", p->key);
		if (p->groups)
			cJSON_AddTrueToObject(q, "groups");
		if (p->uneven)
			cJSON_AddTrueToObject(q, "uneven");
		if (p->vocab)
			cJSON_AddTrueToObject(q, "vocab");
		if (p->value)
			cJSON_AddStringToObject(q, "value", p->value);
		cJSON_AddItemToArray(pr, q);
	}
	cJSON *xs = ep && pl->nexperts ? tp_experts_json(pl) : NULL;
	char *prs = pr ? cJSON_PrintUnformatted(pr) : NULL, *xss = xs ? cJSON_PrintUnformatted(xs) : NULL;
	cJSON_Delete(pr);
	cJSON_Delete(xs);
	/* {"per_rank":[...],"rules":[...]} and under --ep (the plan declaring experts) ,"experts":[...] */
	tp_text t = {0};
	t_str(&t, "{\"per_rank\":");
	t_str(&t, prs ? prs : "");
	t_str(&t, ",\"rules\":[");
	int any = 0;
	for (uint32_t i = rf->nresolved; i-- > 0 && rf->resolved;) {
		char *blk = rf->resolved[i];
		if (blk && *blk) {
			if (any++)
				t_add(&t, ",", 1);
			t_str(&t, blk);
		}
		free(blk);
		rf->resolved[i] = NULL;
	}
	t_add(&t, "]", 1);
	if (ep && pl->nexperts) {
		t_str(&t, ",\"experts\":");
		t_str(&t, xss ? xss : "");
	}
	t_add(&t, "}", 1);
	int bad = rf->resolved_failed || t.oom || !prs || (ep && pl->nexperts && !xss);
	free(prs);
	free(xss);
	if (bad) {
		free(t.p);
		return NULL;
	}
	return t.p;
}

/* ---- config.json ---- */

/* The value rank r gives key pr at the object loc (named where, "" for the top level), from
 * that object's own count; 1 when the key is not there, -1 with e set when it cannot be given. */
static int rank_value(const tp_rf_in *in, const cJSON *loc, const char *where, const tp_per_rank *pr, uint32_t r,
		      int64_t *out, tp_err *e)
{
	tp_expr_ctx c = {.config = loc};
	const cJSON *v = tp_config_get(&c, pr->key);
	if (pr->value) {
		if (tp_expr_int(&c, pr->value, out, e) != 0)
			return v ? tp_fail(e, TP_EINVAL, "config.json: \"%s%s%s\" (per_rank value '%s') cannot be computed",
					   where, *where ? "." : "", pr->key, pr->value)
				 : 1;
		return 0;
	}
	if (!v || cJSON_IsNull(v))
		return 1;
	if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 1e15 ||
	    v->valuedouble != (double)(int64_t)v->valuedouble)
		return tp_fail(e, TP_EINVAL, "config.json: \"%s%s%s\" is not a whole number (up to 10^15), so it cannot hold a rank's count",
			       where, *where ? "." : "", pr->key);
	uint64_t units = (uint64_t)v->valuedouble;
	tp_spec s = tp_spec_split(0, units, 1);
	s.flags = (pr->uneven ? TP_UNEVEN : 0) | (pr->groups ? TP_GROUPS : 0);
	s.pad_to = pr->vocab && in->pad_vocab > 1 ? in->pad_vocab : 0;
	tp_share sh;
	char ctx[300];
	tp_fmt(ctx, sizeof ctx, "config.json: \"%s%s%s\" (a per_rank count of plan '%s')", where, *where ? "." : "",
	       pr->key, in->plan->name);
	if (tp_share_of(units, &s, in->T, r, &sh, ctx, e) < 0) {
		/* no tensor is split by it (or planning would have refused the model): keep it */
		if (in->log && r == 0) {
			char msg[TP_ERR_MSG + 64];
			tp_fmt(msg, sizeof msg, "%s; every rank's config.json keeps it", e->msg);
			in->log(in->log_ctx, 1, msg);
		}
		return 1;
	}
	*out = (int64_t)(sh.count + sh.zeros);
	return 0;
}

/* pad_token_id next to a vocabulary count at loc is a row of the vocabulary: the rank that holds
 * that row gets its local index, the others null (a loader builds nn.Embedding(rows, dim,
 * padding_idx) and refuses an index past its rows). Returns 1 when *set was written. */
static int pad_token(const tp_rf_in *in, const cJSON *loc, const char *where, uint32_t r, tp_cfg_set *set,
		     char *path)
{
	const cJSON *p = cJSON_GetObjectItemCaseSensitive(loc, "pad_token_id");
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(loc, "vocab_size");
	if (!cJSON_IsNumber(p) || !cJSON_IsNumber(v) || p->valuedouble < 0 || v->valuedouble < 1 ||
	    v->valuedouble > 1e15 || p->valuedouble > 1e15 || p->valuedouble != (double)(int64_t)p->valuedouble)
		return 0;
	tp_spec s = tp_spec_split(0, (uint64_t)v->valuedouble, 1);
	s.pad_to = in->pad_vocab > 1 ? in->pad_vocab : 0;
	tp_share sh;
	tp_err e;
	if (tp_share_of((uint64_t)v->valuedouble, &s, in->T, r, &sh, "vocab_size", &e) < 0)
		return 0;
	uint64_t id = (uint64_t)p->valuedouble;
	tp_fmt(path, 300, "%s%spad_token_id", where, *where ? "." : "");
	*set = (tp_cfg_set){.path = path, .value = (int64_t)(id - sh.first), .null = id < sh.first || id >= sh.first + sh.count};
	return 1;
}

/* 1 when expression x names config key `key` (as a whole name, not part of a longer one). */
static int mentions(const char *x, const char *key)
{
	size_t kl = strlen(key);
	for (const char *p = x ? strstr(x, key) : NULL; p; p = strstr(p + 1, key)) {
		char b = p > x ? p[-1] : ' ', a = p[kl];
		int word_b = b == '_' || b == '.' || (b >= '0' && b <= '9') || (b >= 'a' && b <= 'z') || (b >= 'A' && b <= 'Z');
		int word_a = a == '_' || (a >= '0' && a <= '9') || (a >= 'a' && a <= 'z') || (a >= 'A' && a <= 'Z');
		if (!word_b && !word_a)
			return 1;
	}
	return 0;
}

/* --ep: marks in used[] (plan->nrules entries) the rules that would cut a routed expert's tensor
 * without --ep: for every tensor an experts declaration names, the first rule whose pattern (and
 * `when`) matches it. Per-expert tensors ({e} bound) are looked at for expert 0 only: every expert
 * has the same tensors, and the rules' patterns and `when` name experts by the wildcard {e}. */
static void routed_rules(const tp_rf_in *in, unsigned char *used)
{
	const tp_plan *pl = in->plan;
	tp_expr_ctx c = *in->cfg;
	tp_err e;
	for (size_t i = 0; i < in->nfiles; i++) {
		const st_header *h = in->files[i].h;
		for (size_t k = 0; k < h->n; k++) {
			const char *name = h->t[k].name;
			int routed = 0;
			for (int d = 0; d < pl->nexperts && !routed; d++)
				for (int p = 0; p < pl->experts[d].npat && !routed; p++) {
					c.nvar = 0;
					tp_expr_bind(&c, "T", in->T);
					routed = tp_pattern_match(pl->experts[d].pat[p], name, &c) >= 0;
					for (int v = 0; routed && v < c.nvar; v++)
						if (strcmp(c.var[v], "e") == 0 && c.val[v] != 0)
							routed = -1; /* another expert's copy of expert 0's tensor */
				}
			if (routed < 0)
				continue;
			int found = 0;
			for (int r = 0; routed && r < pl->nrules && !found; r++)
				for (int p = 0; p < pl->rules[r].npat && !found; p++) {
					c.nvar = 0;
					tp_expr_bind(&c, "T", in->T);
					if (tp_pattern_match(pl->rules[r].pat[p], name, &c) < 0)
						continue;
					if (pl->rules[r].when && tp_expr_cond(&c, pl->rules[r].when, &e) <= 0)
						continue;
					used[r] = 1;
					found = 1;
				}
		}
	}
}

/* --ep: 1 when per_rank key `key` sizes a routed expert (a rule of used[] names it), so that every
 * rank keeps the source's value: its experts are whole. */
static int expert_sized(const tp_plan *pl, const unsigned char *used, const char *key)
{
	for (int r = 0; r < pl->nrules; r++) {
		const tp_rule *u = &pl->rules[r];
		if (!used[r])
			continue;
		if (mentions(u->size, key) || mentions(u->heads, key) || mentions(u->unit, key))
			return 1;
		for (int k = 0; k < u->nseg; k++)
			if (mentions(u->seg[k], key) || mentions(u->seg_heads[k], key) || mentions(u->seg_unit[k], key))
				return 1;
	}
	return 0;
}

/* Rank r's config.json into *out. */
static int rank_config(const tp_rank_folder *rf, const tp_rf_in *in, uint32_t r, const unsigned char *routed,
		       char **out, size_t *outlen, tp_err *e)
{
	const int nloc = in->plan->nprefix + 1;
	tp_cfg_set *set = calloc((size_t)(2 * in->plan->nper_rank * nloc) + 3, sizeof *set);
	char (*path)[300] = calloc((size_t)(2 * in->plan->nper_rank * nloc) + 3, sizeof *path);
	size_t n = 0;
	int rc = set && path ? 0 : tp_fail(e, TP_ENOMEM, "out of memory");
	for (int i = 0; i < in->plan->nper_rank && rc == 0; i++) {
		const tp_per_rank *pr = &in->plan->per_rank[i];
		int added = 0;
		if (routed && !pr->value && expert_sized(in->plan, routed, pr->key))
			continue; /* --ep: the routed experts are whole */
		for (int l = 0; l < nloc && rc == 0; l++) {
			const char *where = l < in->plan->nprefix ? in->plan->prefix[l] : "";
			const cJSON *loc = *where ? cJSON_GetObjectItemCaseSensitive(in->config, where) : in->config;
			if (!cJSON_IsObject(loc))
				continue;
			int64_t v;
			tp_expr_ctx c = {.config = loc};
			const cJSON *cur = tp_config_get(&c, pr->key);
			int present = cur && !cJSON_IsNull(cur);
			int k = rank_value(in, loc, where, pr, r, &v, e);
			if (k < 0) {
				rc = -1;
			} else if (k == 0 && (present || (!added && !strchr(pr->key, '.')))) {
				/* a value entry is added where the key is missing: once, in the first object */
				tp_fmt(path[n], sizeof path[n], "%s%s%s", where, *where ? "." : "", pr->key);
				set[n] = (tp_cfg_set){.path = path[n], .value = v, .add = !cur};
				n++;
				added = 1;
				if (pr->vocab && present)
					n += pad_token(in, loc, where, r, &set[n], path[n]);
			}
		}
	}
	if (rc == 0 && in->ep) { /* the ep size and this rank's experts, at the top level */
		set[n++] = (tp_cfg_set){.path = "tpfs_ep_size", .value = in->T, .add = 1};
		set[n++] = (tp_cfg_set){.path = "tpfs_ep_experts", .str = rf->rank_ep[r], .add = 1};
	}
	if (rc == 0)
		rc = tp_rank_config(in->config_text, in->config_len, set, n, "config.json", out, outlen, e);
	free(set);
	free(path);
	return rc;
}

/* Rank r's expert range under --ep into buf: "first-last" (inclusive, global expert numbers) of
 * each experts declaration, the distinct ones joined by ","; "" when it holds none. */
static void ep_range_text(const tp_rf_in *in, uint32_t r, char *buf, size_t cap)
{
	size_t w = 0;
	buf[0] = 0;
	for (int d = 0; d < in->plan->nexperts; d++) {
		uint64_t first, count;
		tp_ep_range(in->ep_count[d], in->T, r, &first, &count);
		if (!count)
			continue;
		char one[48];
		snprintf(one, sizeof one, "%llu-%llu", (unsigned long long)first, (unsigned long long)(first + count - 1));
		int dup = 0;
		for (int p = 0; p < d && !dup; p++) {
			uint64_t f2, c2;
			tp_ep_range(in->ep_count[p], in->T, r, &f2, &c2);
			dup = f2 == first && c2 == count;
		}
		if (!dup && w + strlen(one) + 2 < cap)
			w += (size_t)snprintf(buf + w, cap - w, "%s%s", w ? "," : "", one);
	}
}

void tp_ep_range(int64_t E, uint32_t T, uint32_t r, uint64_t *first, uint64_t *count)
{
	*first = *count = 0;
	if (E <= 0 || r >= T)
		return;
	tp_spec s = tp_spec_owned((uint64_t)E, 0);
	tp_share sh;
	if (tp_share_of(s.seg[0], &s, T, r, &sh, "", NULL) == 0) { /* the layouts' distribution */
		*first = sh.first;
		*count = sh.count;
	}
}

int tp_rank_folder_build(tp_rank_folder *rf, const tp_rf_in *in, char ***gen, uint64_t **gen_len, int *rewritten,
			 tp_err *e)
{
	/* the plan digest and the rank metadata */
	char *plan = tp_resolved_plan_text(rf, in->plan, in->ep);
	if (!plan)
		return tp_fail(e, TP_ENOMEM, "out of memory writing the resolved plan");
	char hex[65];
	tp_sha256_hex(plan, strlen(plan), hex);
	free(plan);
	size_t tl = strlen(in->plan->name) + 80;
	rf->plan_tag = malloc(tl);
	const size_t nm = in->ep ? 5 : 3;
	rf->rank_meta = calloc((size_t)in->T * nm, sizeof *rf->rank_meta);
	rf->rank_num = calloc(in->T + 1, sizeof *rf->rank_num);
	rf->rank_ep = in->ep ? calloc(in->T, sizeof *rf->rank_ep) : NULL;
	if (!rf->plan_tag || !rf->rank_meta || !rf->rank_num || (in->ep && !rf->rank_ep))
		return tp_fail(e, TP_ENOMEM, "out of memory");
	snprintf(rf->plan_tag, tl, "%s sha256:%s", in->plan->name, hex);
	snprintf(rf->rank_num[in->T], sizeof rf->rank_num[in->T], "%u", in->T);
	for (uint32_t r = 0; r < in->T; r++) {
		snprintf(rf->rank_num[r], sizeof rf->rank_num[r], "%u", r);
		st_meta *x = &rf->rank_meta[nm * r];
		x[0] = (st_meta){"tpfs.plan", rf->plan_tag};
		x[1] = (st_meta){"tpfs.tp_rank", rf->rank_num[r]};
		x[2] = (st_meta){"tpfs.tp_size", rf->rank_num[in->T]};
		if (in->ep) {
			ep_range_text(in, r, rf->rank_ep[r], sizeof rf->rank_ep[r]);
			x[3] = (st_meta){"tpfs.ep_size", rf->rank_num[in->T]};
			x[4] = (st_meta){"tpfs.ep_experts", rf->rank_ep[r]};
		}
		for (size_t i = 0; i < in->nfiles; i++)
			if (in->files[i].lay)
				tp_layout_set_meta(&in->files[i].lay[r], x, nm);
	}
	/* the source's config.json (MNT/config.json) and each rank's */
	if (!in->config_plain || !in->config)
		return 0;
	if (!in->config_text || in->config_len != in->config_size) /* the text config.json was parsed from */
		return tp_fail(e, TP_EIO, "config.json: changed while planning");
	if (in->config_global)
		return 0;
	/* tpfs plan (keep_going) builds them too: a per_rank key that cannot hold a rank's count (a
	 * list, a value past its limit) refuses the plan there as it would refuse the mount */
	unsigned char *routed = NULL; /* --ep: the rules that size routed experts */
	if (in->ep) {
		routed = calloc(in->plan->nrules ? (size_t)in->plan->nrules : 1, 1);
		if (!routed)
			return tp_fail(e, TP_ENOMEM, "out of memory");
		routed_rules(in, routed);
	}
	*gen = calloc(in->T, sizeof **gen);
	*gen_len = calloc(in->T, sizeof **gen_len);
	int rc = *gen && *gen_len ? 0 : tp_fail(e, TP_ENOMEM, "out of memory");
	for (uint32_t r = 0; r < in->T && rc == 0; r++) {
		size_t len;
		rc = rank_config(rf, in, r, routed, &(*gen)[r], &len, e);
		(*gen_len)[r] = len;
	}
	free(routed);
	if (rc < 0)
		return -1;
	*rewritten = 1;
	return 0;
}

void tp_rank_folder_free(tp_rank_folder *rf)
{
	if (rf->resolved)
		for (uint32_t i = 0; i < rf->nresolved; i++)
			free(rf->resolved[i]);
	free(rf->resolved);
	free(rf->plan_tag);
	free(rf->rank_meta);
	free(rf->rank_num);
	free(rf->rank_ep);
	memset(rf, 0, sizeof *rf);
}
