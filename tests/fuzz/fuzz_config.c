/* fuzz_config.c: libFuzzer target for a rank's config.json (rank_config.h). The input is a
 * config.json; three fixed lists of keys are set in it (top-level and nested counts, keys added
 * where missing). Nothing may crash, hang or leak; a rewrite that succeeds must still be JSON,
 * and every set key that a lookup finds must hold its new value. */
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

static const cJSON *find(const cJSON *j, const char *path)
{
	char p[64];
	strcpy(p, path);
	for (char *t = strtok(p, "."); t && j; t = strtok(NULL, "."))
		j = cJSON_GetObjectItemCaseSensitive(j, t);
	return j;
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
		for (int s = 0; s < 2; s++) {
			const cJSON *v = find(j, sets[k][s].path);
			if (cJSON_IsNumber(v) && v->valuedouble != (double)sets[k][s].value)
				abort(); /* a set key kept its old value (duplicate keys aside: all are rewritten) */
		}
		cJSON_Delete(j);
		free(out);
	}
	return 0;
}
