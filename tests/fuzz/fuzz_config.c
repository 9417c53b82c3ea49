/* fuzz_config.c: libFuzzer target for a rank's config.json (rank_config.h). The input is a
 * config.json; three fixed lists of keys are set in it (top-level and nested counts, keys added
 * where missing). Nothing may crash, hang or leak; a rewrite that succeeds must still be JSON,
 * and every occurrence of a set key, escaped or duplicated, must hold its new value. */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "rank_config.h"

static const tp_cfg_set sets[][2] = {
	{{"num_attention_heads", 2, 0, 0, NULL}, {"head_dim", 4, 1, 0, NULL}},
	{{"text_config.num_attention_heads", 3, 0, 0, NULL}, {"text_config.head_dim", 5, 1, 0, NULL}},
	{{"a.b.c", 1, 1, 0, NULL}, {"x", 7, 1, 0, NULL}},
	{{"tpfs_ep_size", 4, 1, 0, NULL}, {"tpfs_ep_experts", 0, 1, 0, "8-15"}}, /* --ep: a string value */
};

/* Does every number at path hold want, and where the key was to be added, is it in each object
 * that should hold it? Every occurrence of each component is followed (readers differ on which
 * duplicate key counts), by its decoded name (escapes undone), as a loader sees it. */
static int all_hold(const cJSON *j, const char *path, double want, int added)
{
	const char *dot = strchr(path, '.');
	size_t n = dot ? (size_t)(dot - path) : strlen(path);
	int found = 0;
	for (const cJSON *m = cJSON_IsObject(j) ? j->child : NULL; m; m = m->next) {
		if (!m->string || strlen(m->string) != n || memcmp(m->string, path, n))
			continue;
		found++;
		if (dot ? !all_hold(m, dot + 1, want, added) : cJSON_IsNumber(m) && m->valuedouble != want)
			return 0;
	}
	return found || dot || !added || !cJSON_IsObject(j); /* a key to add is in each of its objects */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	for (size_t k = 0; k < sizeof sets / sizeof *sets; k++) {
		char *out;
		size_t len;
		tp_err e;
		if (tp_rank_config((const char *)data, size, sets[k], 2, "config.json", &out, &len, &e) < 0)
			continue;
		cJSON *j = cJSON_ParseWithLength(out, len);
		if (!j)
			abort(); /* the rewrite broke the JSON */
		for (int s = 0; s < 2; s++)
			if (!all_hold(j, sets[k][s].path, (double)sets[k][s].value, sets[k][s].add))
				abort(); /* a set key (some occurrence of it) kept its old value */
		cJSON_Delete(j);
		free(out);
	}
	return 0;
}
