/* index_json.c: rewriting *.safetensors.index.json per rank (see index_json.h). */
#include "index_json.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void w_str(st_wbuf *w, const char *s)
{
	st_w_raw(w, s, strlen(s));
}

/* Writes sep, then "key": value for the JSON member it (its value compact, as it was). */
static void w_member(st_wbuf *w, const char *sep, const cJSON *it)
{
	char *v = cJSON_PrintUnformatted(it);
	w_str(w, sep);
	st_w_json_string(w, it->string);
	w_str(w, ": ");
	w_str(w, v ? v : "null");
	free(v);
}

/* Writes (or counts) rank r's rewrite of index j: metadata keys kept, total_size replaced by
 * the local tensor bytes, weight_map restricted to the tensors the rank has. */
static tp_index_file find(const tp_index_in *in, const cJSON *it)
{
	if (!cJSON_IsString(it))
		return (tp_index_file){.kind = TP_IX_NONE};
	return in->find(in->find_ctx, it->valuestring);
}

static uint64_t write_index(const tp_index_in *in, const cJSON *j, uint32_t r, st_wbuf *w)
{
	uint64_t total = 0;
	const cJSON *wm = cJSON_GetObjectItemCaseSensitive(j, "weight_map"), *it;
	cJSON_ArrayForEach(it, wm)
	{
		tp_index_file f = find(in, it);
		if (f.kind != TP_IX_TENSORS)
			continue;
		const st_tensor *t = st_find(f.h, it->string);
		if (!t)
			continue;
		uint32_t li = f.lay[r].loc[t - f.h->t];
		if (li != UINT32_MAX)
			total += f.lay[r].t[li].size;
	}
	w->len = 0;
	w_str(w, "{\n  \"metadata\": {\n    \"total_size\": ");
	st_w_u64(w, total);
	const cJSON *md = cJSON_GetObjectItemCaseSensitive(j, "metadata");
	cJSON_ArrayForEach(it, md)
		if (strcmp(it->string, "total_size"))
			w_member(w, ",\n    ", it);
	w_str(w, "\n  },\n  \"weight_map\": {");
	int first = 1;
	cJSON_ArrayForEach(it, wm)
	{
		tp_index_file f = find(in, it);
		if (f.kind == TP_IX_TENSORS) {
			const st_tensor *t = st_find(f.h, it->string);
			if (t && f.lay[r].loc[t - f.h->t] == UINT32_MAX)
				continue; /* not on this rank */
		}
		w_member(w, first ? "\n    " : ",\n    ", it);
		first = 0;
	}
	w_str(w, first ? "}" : "\n  }");
	cJSON_ArrayForEach(it, j)
		if (strcmp(it->string, "metadata") && strcmp(it->string, "weight_map"))
			w_member(w, ",\n  ", it);
	w_str(w, "\n}\n");
	return w->len;
}

int tp_index_rewrite(const tp_index_in *in, const cJSON *j, char ***gen, uint64_t **gen_len, tp_err *e)
{
	const cJSON *wm = cJSON_GetObjectItemCaseSensitive(j, "weight_map"), *it;
	cJSON_ArrayForEach(it, wm)
	{
		tp_index_file f = find(in, it);
		if (f.kind == TP_IX_NONE)
			tp_logf(in->log, in->log_ctx, 0, "%s: weight_map lists '%s' in '%s', which is not in the checkpoint",
				in->path, it->string, cJSON_IsString(it) ? it->valuestring : "(not a string)");
		else if (f.kind == TP_IX_TENSORS && !st_find(f.h, it->string))
			tp_logf(in->log, in->log_ctx, 0, "%s: weight_map lists '%s' in '%s', whose header has no such tensor",
				in->path, it->string, it->valuestring);
	}
	*gen = calloc(in->T, sizeof **gen);
	*gen_len = calloc(in->T, sizeof **gen_len);
	if (!*gen || !*gen_len)
		return tp_fail(e, TP_ENOMEM, "out of memory");
	for (uint32_t r = 0; r < in->T; r++) {
		st_wbuf w = {.p = NULL};
		uint64_t len = write_index(in, j, r, &w);
		(*gen)[r] = malloc(len + 1);
		if (!(*gen)[r])
			return tp_fail(e, TP_ENOMEM, "out of memory");
		w.p = (*gen)[r];
		write_index(in, j, r, &w);
		(*gen_len)[r] = len;
	}
	return 0;
}
