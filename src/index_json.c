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
static uint64_t write_index(tp_model *m, uint32_t idx, const cJSON *j, uint32_t r, st_wbuf *w)
{
	uint64_t total = 0;
	const cJSON *wm = cJSON_GetObjectItemCaseSensitive(j, "weight_map"), *it;
	cJSON_ArrayForEach(it, wm)
	{
		uint32_t f = cJSON_IsString(it) ? tp_node_resolve(m, m->n[idx].parent, it->valuestring) : UINT32_MAX;
		if (f == UINT32_MAX || m->n[f].kind != TN_TENSORS)
			continue;
		const st_tensor *t = st_find(&m->n[f].h, it->string);
		if (!t)
			continue;
		uint32_t li = m->n[f].lay[r].loc[t - m->n[f].h.t];
		if (li != UINT32_MAX)
			total += m->n[f].lay[r].t[li].size;
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
		uint32_t f = cJSON_IsString(it) ? tp_node_resolve(m, m->n[idx].parent, it->valuestring) : UINT32_MAX;
		if (f != UINT32_MAX && m->n[f].kind == TN_TENSORS) {
			const st_tensor *t = st_find(&m->n[f].h, it->string);
			if (t && m->n[f].lay[r].loc[t - m->n[f].h.t] == UINT32_MAX)
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

int tp_index_rewrite(tp_model *m, uint32_t idx, const cJSON *j, tp_err *e)
{
	tp_node *n = &m->n[idx];
	const cJSON *wm = cJSON_GetObjectItemCaseSensitive(j, "weight_map"), *it;
	cJSON_ArrayForEach(it, wm)
	{
		uint32_t f = cJSON_IsString(it) ? tp_node_resolve(m, n->parent, it->valuestring) : UINT32_MAX;
		if (f == UINT32_MAX || m->n[f].kind == TN_DIR)
			tp_model_log(m, 0, "%s: weight_map lists '%s' in '%s', which is not in the checkpoint", n->path,
			      it->string, cJSON_IsString(it) ? it->valuestring : "(not a string)");
		else if (m->n[f].kind == TN_TENSORS && !st_find(&m->n[f].h, it->string))
			tp_model_log(m, 0, "%s: weight_map lists '%s' in '%s', whose header has no such tensor", n->path,
			      it->string, it->valuestring);
	}
	n->gen = calloc(m->T, sizeof *n->gen);
	n->gen_len = calloc(m->T, sizeof *n->gen_len);
	if (!n->gen || !n->gen_len)
		return tp_fail(e, TP_ENOMEM, "out of memory");
	for (uint32_t r = 0; r < m->T; r++) {
		st_wbuf w = {.p = NULL};
		uint64_t len = write_index(m, idx, j, r, &w);
		n->gen[r] = malloc(len + 1);
		if (!n->gen[r])
			return tp_fail(e, TP_ENOMEM, "out of memory");
		w.p = n->gen[r];
		write_index(m, idx, j, r, &w);
		n->gen_len[r] = len;
	}
	return 0;
}
