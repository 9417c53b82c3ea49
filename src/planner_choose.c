/* planner_choose.c: choosing the plan for a checkpoint (see planner.h, "plan choice"): a
 * built-in plan by name with its chain of "extends", the built-in whose "detect" section
 * matches config.json, or a plan file, and the refusal of a checkpoint whose config.json names
 * no architecture a built-in plan knows.
 */
#include "planner.h"
#include "slurp.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* Does the string value v appear in the list l? */
static int listed(const cJSON *l, const cJSON *v)
{
	const cJSON *it;
	if (!cJSON_IsString(v))
		return 0;
	cJSON_ArrayForEach(it, l) if (cJSON_IsString(it) && strcmp(it->valuestring, v->valuestring) == 0) return 1;
	return 0;
}

/* Does plan detection det know cfg's model_type (by_arch 0) or one of its architectures (1)? */
static int detect_one(const cJSON *det, const cJSON *cfg, int by_arch)
{
	if (!cJSON_IsObject(cfg))
		return 0;
	const cJSON *mt = cJSON_GetObjectItemCaseSensitive(det, "model_type");
	const cJSON *ar = cJSON_GetObjectItemCaseSensitive(det, "architectures");
	if (!by_arch)
		return listed(mt, cJSON_GetObjectItemCaseSensitive(cfg, "model_type"));
	const cJSON *a;
	cJSON_ArrayForEach(a, cJSON_GetObjectItemCaseSensitive(cfg, "architectures")) if (listed(ar, a)) return 1;
	return 0;
}

int tp_builtin_detect(const cJSON *config)
{
	if (!config)
		return -1;
	/* the top level before text_config, and at each a model_type any plan knows before the
	 * architectures (a plan listing an architecture must not win over the plan of the model_type) */
	for (int pass = 0; pass < 4; pass++) {
		const cJSON *cfg = pass / 2 ? cJSON_GetObjectItemCaseSensitive(config, "text_config") : config;
		for (int i = 0; i < tp_builtin_count(); i++) {
			size_t len;
			const char *text = tp_builtin_text(i, &len);
			cJSON *p = cJSON_ParseWithLength(text, len);
			int hit = p && detect_one(cJSON_GetObjectItemCaseSensitive(p, "detect"), cfg, pass % 2);
			cJSON_Delete(p);
			if (hit)
				return i;
		}
	}
	return -1;
}

static int ends_with(const char *s, const char *suf)
{
	size_t a = strlen(s), b = strlen(suf);
	return a >= b && strcmp(s + a - b, suf) == 0;
}

/* The built-in plans as "a, b, c", or with the model types each detects: "a (x, y); b; ...". */
static void builtin_list(char *list, size_t n, int with_types)
{
	list[0] = 0;
	for (int i = 0; i < tp_builtin_count(); i++) {
		size_t l = strlen(list);
		tp_fmt(list + l, n - l, "%s%s", i ? (with_types ? "; " : ", ") : "", tp_builtin_name(i));
		if (!with_types)
			continue;
		size_t len;
		const char *text = tp_builtin_text(i, &len);
		cJSON *p = cJSON_ParseWithLength(text, len);
		const cJSON *mt = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(p, "detect"), "model_type"), *it;
		int k = 0;
		cJSON_ArrayForEach(it, mt)
		{
			if (!cJSON_IsString(it))
				continue;
			l = strlen(list);
			tp_fmt(list + l, n - l, "%s%s", k++ ? ", " : " (", it->valuestring);
		}
		l = strlen(list);
		tp_fmt(list + l, n - l, "%s", k ? ")" : " (only with --plan generic)");
		cJSON_Delete(p);
	}
}

/* The refusal of a checkpoint whose architecture no built-in plan knows. */
static int refuse_unknown(const cJSON *config, tp_err *e)
{
	char arch[256] = "", list[TP_ERR_MSG / 2];
	const cJSON *mt = config ? cJSON_GetObjectItemCaseSensitive(config, "model_type") : NULL;
	const cJSON *tc = config ? cJSON_GetObjectItemCaseSensitive(config, "text_config") : NULL;
	const cJSON *tmt = cJSON_GetObjectItemCaseSensitive(tc, "model_type");
	if (cJSON_IsString(mt))
		tp_fmt(arch, sizeof arch, "model_type '%.80s'%s%.80s%s", mt->valuestring, cJSON_IsString(tmt) ? " (text_config: '" : "",
		       cJSON_IsString(tmt) ? tmt->valuestring : "", cJSON_IsString(tmt) ? "')" : "");
	else if (cJSON_IsString(tmt))
		tp_fmt(arch, sizeof arch, "text_config.model_type '%.80s'", tmt->valuestring);
	else
		tp_fmt(arch, sizeof arch, "%s", config ? "a config.json without model_type" : "a checkpoint without config.json");
	/* a family whose model code was read and found unservable: its reason, not the list of plans */
	const char *why = tp_builtin_examined(cJSON_IsString(mt) ? mt->valuestring : NULL);
	if (!why)
		why = tp_builtin_examined(cJSON_IsString(tmt) ? tmt->valuestring : NULL);
	if (why)
		return tp_fail(e, TP_EINVAL, "no built-in plan knows %s, a family whose model code tpfs has read and does "
			       "not serve (docs/ARCHITECTURES.md; a plan file of your own: --plan FILE): %s", arch, why);
	builtin_list(list, sizeof list, 0); /* the model types of every plan no longer fit in one message */
	return tp_fail(e, TP_EINVAL,
		       "no built-in plan knows %s (built-in plans: %s; 'tpfs plan --list' shows the model types each "
		       "detects, docs/COVERAGE.md the families served and refused); give a plan file with --plan FILE (docs/PLANS.md), "
		       "or, after checking what it does with 'tpfs plan SRC --tp N --plan generic', accept the generic "
		       "name-based guess with --plan generic",
		       arch, list);
}

int tp_plan_choose(const cJSON *config, const char *want, tp_plan *p, char *origin, size_t n, tp_err *e)
{
	int bi = -1;
	memset(p, 0, sizeof *p);
	if (!want) {
		bi = tp_builtin_detect(config);
		if (bi < 0)
			return refuse_unknown(config, e);
		tp_fmt(origin, n, "built-in %s (detected from config.json)", tp_builtin_name(bi));
	} else if (!strchr(want, '/') && !ends_with(want, ".json")) {
		bi = tp_builtin_find(want);
		if (bi < 0) {
			char list[512];
			builtin_list(list, sizeof list, 0);
			return tp_fail(e, TP_EINVAL, "--plan %s: no such built-in plan (built-in: %s; or give a plan file path)",
				       want, list);
		}
		tp_fmt(origin, n, "built-in %s (--plan)", want);
	}
	if (bi >= 0)
		return tp_plan_builtin(tp_builtin_name(bi), p, e);
	/* a user plan file */
	size_t len;
	char *text = tp_slurp(want, want, "(give a plan file)", &len, e);
	if (!text)
		return -1;
	int rc = tp_plan_parse(text, len, want, p, e);
	free(text);
	if (rc < 0)
		return -1;
	tp_fmt(origin, n, "%s", want);
	if (p->extends) {
		tp_plan base;
		if (tp_plan_builtin(p->extends, &base, e) < 0) {
			tp_err_prefix(e, "%s", want);
			tp_plan_free(p);
			return -1;
		}
		if (tp_plan_extend(p, &base, e) < 0) {
			tp_plan_free(p);
			return -1;
		}
		tp_fmt(origin, n, "%s (extends built-in %s)", want, p->extends);
	}
	return 0;
}
