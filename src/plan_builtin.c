/* plan_builtin.c: the plan files of plans/ compiled into the binary, and picking one from
 * config.json. */
#include "plan.h"

#include <cjson/cJSON.h>
#include <string.h>

#include "plans_data.h"

int tp_builtin_count(void)
{
	return (int)(sizeof builtin_plans / sizeof builtin_plans[0]);
}

const char *tp_builtin_name(int i)
{
	return i >= 0 && i < tp_builtin_count() ? builtin_plans[i].name : NULL;
}

const char *tp_builtin_text(int i, size_t *len)
{
	if (i < 0 || i >= tp_builtin_count())
		return NULL;
	*len = strlen(builtin_plans[i].text);
	return builtin_plans[i].text;
}

int tp_builtin_find(const char *name)
{
	for (int i = 0; i < tp_builtin_count(); i++)
		if (strcmp(builtin_plans[i].name, name) == 0)
			return i;
	return -1;
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

static int detect_one(const cJSON *det, const cJSON *cfg)
{
	if (!cJSON_IsObject(cfg))
		return 0;
	const cJSON *mt = cJSON_GetObjectItemCaseSensitive(det, "model_type");
	const cJSON *ar = cJSON_GetObjectItemCaseSensitive(det, "architectures");
	if (listed(mt, cJSON_GetObjectItemCaseSensitive(cfg, "model_type")))
		return 1;
	const cJSON *a;
	cJSON_ArrayForEach(a, cJSON_GetObjectItemCaseSensitive(cfg, "architectures")) if (listed(ar, a)) return 1;
	return 0;
}

int tp_builtin_detect(const cJSON *config)
{
	if (!config)
		return -1;
	/* top-level model_type first for every plan, then text_config */
	for (int pass = 0; pass < 2; pass++) {
		const cJSON *cfg = pass ? cJSON_GetObjectItemCaseSensitive(config, "text_config") : config;
		for (int i = 0; i < tp_builtin_count(); i++) {
			cJSON *p = cJSON_Parse(builtin_plans[i].text);
			int hit = p && detect_one(cJSON_GetObjectItemCaseSensitive(p, "detect"), cfg);
			cJSON_Delete(p);
			if (hit)
				return i;
		}
	}
	return -1;
}
