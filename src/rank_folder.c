/* rank_folder.c: the resolved plan's digest, rank metadata and per-rank config.json (see
 * rank_folder.h). */
#include "rank_folder.h"

#include <cjson/cJSON.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "rank_config.h"
#include "sha256.h"

cJSON *tp_resolved_rule(const tp_plan *pl, const st_tensor *t, const tp_resolved *res)
{
	const tp_spec *s = &res->spec;
	cJSON *j = cJSON_CreateObject();
	if (!j)
		return NULL;
	cJSON_AddStringToObject(j, "match", t->name);
	if (s->kind != TP_SPLIT) {
		cJSON_AddStringToObject(j, "split", "replicate");
		return j;
	}
	cJSON_AddStringToObject(j, "split", "axis");
	cJSON_AddNumberToObject(j, "axis", s->axis);
	cJSON_AddNumberToObject(j, "unit", (double)s->unit);
	cJSON_AddNumberToObject(j, "size", (double)res->logical);
	cJSON_AddNumberToObject(j, "div", (double)s->div);
	if (s->nseg > 1) {
		cJSON *sg = cJSON_AddArrayToObject(j, "segments");
		for (uint32_t k = 0; k < s->nseg; k++) {
			uint64_t u = s->segu[k] ? s->segu[k] : s->unit;
			cJSON *so = cJSON_CreateObject();
			cJSON_AddNumberToObject(so, "size", (double)(s->seg[k] * u));
			cJSON_AddNumberToObject(so, "unit", (double)u);
			cJSON_AddItemToArray(sg, so);
		}
	}
	if (s->flags & TP_UNEVEN)
		cJSON_AddTrueToObject(j, "uneven");
	if (s->flags & TP_GROUPS)
		cJSON_AddTrueToObject(j, "groups");
	if (res->rule >= 0 && pl->rules[res->rule].vocab)
		cJSON_AddTrueToObject(j, "vocab");
	return j;
}

void tp_resolved_keep(tp_model *m, uint32_t idx, cJSON **rule)
{
	const tp_node *n = &m->n[idx];
	if (!m->resolved)
		m->resolved = calloc(m->nn, sizeof *m->resolved);
	cJSON *block = m->resolved ? cJSON_CreateArray() : NULL;
	for (size_t k = n->h.n; k-- > 0;) {
		cJSON **r = &rule[n->h.by_name[k]];
		if (block && *r) {
			cJSON_AddItemToArray(block, *r);
			*r = NULL;
		} else if (!*r && block) {
			cJSON_Delete(block); /* a rule is missing (out of memory): no digest */
			block = NULL;
			m->resolved_failed = 1;
		}
	}
	for (size_t k = 0; k < n->h.n; k++)
		cJSON_Delete(rule[k]);
	free(rule);
	if (!block)
		m->resolved_failed = 1;
	else
		m->resolved[idx] = block;
}

char *tp_resolved_plan_text(tp_model *m)
{
	cJSON *o = cJSON_CreateObject();
	cJSON *pr = cJSON_AddArrayToObject(o, "per_rank");
	for (int i = 0; i < m->plan.nper_rank; i++) {
		const tp_per_rank *p = &m->plan.per_rank[i];
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
	cJSON *rules = cJSON_AddArrayToObject(o, "rules");
	for (uint32_t i = m->nn; i-- > 0 && m->resolved;) {
		cJSON *b = m->resolved[i], *it;
		if (!b)
			continue;
		while ((it = b->child)) {
			cJSON_DetachItemViaPointer(b, it);
			cJSON_AddItemToArray(rules, it);
		}
		cJSON_Delete(b);
		m->resolved[i] = NULL;
	}
	char *s = m->resolved_failed || !rules ? NULL : cJSON_PrintUnformatted(o);
	cJSON_Delete(o);
	return s;
}

/* ---- config.json ---- */

static char *read_all(const char *path, size_t *len)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	struct stat st;
	if (fd < 0)
		return NULL;
	char *b = NULL;
	if (fstat(fd, &st) == 0 && st.st_size >= 0 && st.st_size < (1 << 30))
		b = malloc((size_t)st.st_size + 1);
	size_t got = 0;
	while (b && got < (size_t)st.st_size) {
		ssize_t r = read(fd, b + got, (size_t)st.st_size - got);
		if (r <= 0)
			break;
		got += (size_t)r;
	}
	close(fd);
	if (b && got != (size_t)st.st_size) {
		free(b);
		return NULL;
	}
	if (b)
		b[got] = 0;
	*len = got;
	return b;
}

/* The value rank r gives key pr at the object loc (named where, "" for the top level), from
 * that object's own count; 1 when the key is not there, -1 with e set when it cannot be given. */
static int rank_value(const tp_model *m, const cJSON *loc, const char *where, const tp_per_rank *pr, uint32_t r,
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
	s.pad_to = pr->vocab && m->o->pad_vocab > 1 ? m->o->pad_vocab : 0;
	tp_share sh;
	char ctx[300];
	tp_fmt(ctx, sizeof ctx, "config.json: \"%s%s%s\" (a per_rank count of plan '%s')", where, *where ? "." : "",
	       pr->key, m->plan.name);
	if (tp_share_of(units, &s, m->T, r, &sh, ctx, e) < 0) {
		/* no tensor is split by it (or planning would have refused the model): keep it */
		if (m->o->log && r == 0) {
			char msg[TP_ERR_MSG + 64];
			tp_fmt(msg, sizeof msg, "%s; every rank's config.json keeps it", e->msg);
			m->o->log(m->o->ctx, 1, msg);
		}
		return 1;
	}
	*out = (int64_t)(sh.count + sh.zeros);
	return 0;
}

/* pad_token_id next to a vocabulary count at loc is a row of the vocabulary: the rank that holds
 * that row gets its local index, the others null (a loader builds nn.Embedding(rows, dim,
 * padding_idx) and refuses an index past its rows). Returns 1 when *set was written. */
static int pad_token(const tp_model *m, const cJSON *loc, const char *where, uint32_t r, tp_cfg_set *set,
		     char *path)
{
	const cJSON *p = cJSON_GetObjectItemCaseSensitive(loc, "pad_token_id");
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(loc, "vocab_size");
	if (!cJSON_IsNumber(p) || !cJSON_IsNumber(v) || p->valuedouble < 0 || v->valuedouble < 1 ||
	    v->valuedouble > 1e15 || p->valuedouble != (double)(int64_t)p->valuedouble)
		return 0;
	tp_spec s = tp_spec_split(0, (uint64_t)v->valuedouble, 1);
	s.pad_to = m->o->pad_vocab > 1 ? m->o->pad_vocab : 0;
	tp_share sh;
	tp_err e;
	if (tp_share_of((uint64_t)v->valuedouble, &s, m->T, r, &sh, "vocab_size", &e) < 0)
		return 0;
	uint64_t id = (uint64_t)p->valuedouble;
	tp_fmt(path, 300, "%s%spad_token_id", where, *where ? "." : "");
	*set = (tp_cfg_set){.path = path, .value = (int64_t)(id - sh.first), .null = id < sh.first || id >= sh.first + sh.count};
	return 1;
}

/* Rank r's config.json into *out. */
static int rank_config(tp_model *m, uint32_t r, char **out, size_t *outlen, tp_err *e)
{
	const int nloc = m->plan.nprefix + 1;
	tp_cfg_set *set = calloc((size_t)(2 * m->plan.nper_rank * nloc) + 1, sizeof *set);
	char (*path)[300] = calloc((size_t)(2 * m->plan.nper_rank * nloc) + 1, sizeof *path);
	size_t n = 0;
	int rc = set && path ? 0 : tp_fail(e, TP_ENOMEM, "out of memory");
	for (int i = 0; i < m->plan.nper_rank && rc == 0; i++) {
		const tp_per_rank *pr = &m->plan.per_rank[i];
		int added = 0;
		for (int l = 0; l < nloc && rc == 0; l++) {
			const char *where = l < m->plan.nprefix ? m->plan.prefix[l] : "";
			const cJSON *loc = *where ? cJSON_GetObjectItemCaseSensitive(m->config, where) : m->config;
			if (!cJSON_IsObject(loc))
				continue;
			int64_t v;
			tp_expr_ctx c = {.config = loc};
			const cJSON *cur = tp_config_get(&c, pr->key);
			int present = cur && !cJSON_IsNull(cur);
			int k = rank_value(m, loc, where, pr, r, &v, e);
			if (k < 0) {
				rc = -1;
			} else if (k == 0 && (present || (!added && !strchr(pr->key, '.')))) {
				/* a value entry is added where the key is missing: once, in the first object */
				tp_fmt(path[n], sizeof path[n], "%s%s%s", where, *where ? "." : "", pr->key);
				set[n] = (tp_cfg_set){.path = path[n], .value = v, .add = !cur};
				n++;
				added = 1;
				if (pr->vocab && present)
					n += pad_token(m, loc, where, r, &set[n], path[n]);
			}
		}
	}
	if (rc == 0)
		rc = tp_rank_config(m->config_text, m->config_len, set, n, "config.json", out, outlen, e);
	free(set);
	free(path);
	return rc;
}

int tp_rank_folder_build(tp_model *m, tp_err *e)
{
	/* the plan digest and the rank metadata */
	char *plan = tp_resolved_plan_text(m);
	if (!plan)
		return tp_fail(e, TP_ENOMEM, "out of memory writing the resolved plan");
	char hex[65];
	tp_sha256_hex(plan, strlen(plan), hex);
	free(plan);
	size_t tl = strlen(m->plan.name) + 80;
	m->plan_tag = malloc(tl);
	m->rank_meta = calloc((size_t)m->T * 3, sizeof *m->rank_meta);
	m->rank_num = calloc(m->T + 1, sizeof *m->rank_num);
	if (!m->plan_tag || !m->rank_meta || !m->rank_num)
		return tp_fail(e, TP_ENOMEM, "out of memory");
	snprintf(m->plan_tag, tl, "%s sha256:%s", m->plan.name, hex);
	snprintf(m->rank_num[m->T], sizeof m->rank_num[m->T], "%u", m->T);
	for (uint32_t r = 0; r < m->T; r++) {
		snprintf(m->rank_num[r], sizeof m->rank_num[r], "%u", r);
		st_meta *x = &m->rank_meta[3 * r];
		x[0] = (st_meta){"tpfs.plan", m->plan_tag};
		x[1] = (st_meta){"tpfs.tp_rank", m->rank_num[r]};
		x[2] = (st_meta){"tpfs.tp_size", m->rank_num[m->T]};
		for (uint32_t i = 0; i < m->nn; i++)
			if (m->n[i].kind == TN_TENSORS && m->n[i].lay)
				tp_layout_set_meta(&m->n[i].lay[r], x, 3);
	}
	/* the source's config.json (MNT/config.json) and each rank's */
	m->config_node = tp_node_child(m, 0, "config.json");
	if (m->config_node == UINT32_MAX || !m->config || m->n[m->config_node].kind != TN_PLAIN) {
		m->config_node = UINT32_MAX;
		return 0;
	}
	tp_node *n = &m->n[m->config_node];
	m->config_text = read_all(n->abspath, &m->config_len);
	if (!m->config_text || m->config_len != n->src_size)
		return tp_fail(e, TP_EIO, "config.json: cannot read it again (or it changed while planning)");
	if (m->o->config_global || m->o->keep_going)
		return 0; /* tpfs plan (keep_going) reports refusals, and prints the per-rank counts itself */
	if (m->o->ep) {
		/* whole experts under their global numbers: no count in config.json says that */
		if (m->o->log)
			m->o->log(m->o->ctx, 1, "--ep: every rank's config.json is the source's (a rank's share of the "
				  "experts, kept under their global numbers, is not a count config.json can state)");
		return 0;
	}
	n->gen = calloc(m->T, sizeof *n->gen);
	n->gen_len = calloc(m->T, sizeof *n->gen_len);
	if (!n->gen || !n->gen_len)
		return tp_fail(e, TP_ENOMEM, "out of memory");
	for (uint32_t r = 0; r < m->T; r++) {
		size_t len;
		if (rank_config(m, r, &n->gen[r], &len, e) < 0)
			return -1;
		n->gen_len[r] = len;
	}
	n->kind = TN_CONFIG;
	return 0;
}

void tp_rank_folder_free(tp_model *m)
{
	if (m->resolved)
		for (uint32_t i = 0; i < m->nn; i++)
			cJSON_Delete(m->resolved[i]);
	free(m->resolved);
	free(m->plan_tag);
	free(m->rank_meta);
	free(m->rank_num);
	free(m->config_text);
}
