/* index_json.h: the per-rank rewrite of a *.safetensors.index.json. Rank r's index keeps the
 * metadata keys (total_size replaced by the rank's tensor bytes), lists in weight_map only the
 * tensors the rank has, and keeps every other member as it was, each value compact. */
#ifndef TP_INDEX_JSON_H
#define TP_INDEX_JSON_H

#include <stdint.h>

#include "model.h"
#include "tp_err.h"

struct cJSON;

/* Writes the T rewrites of index node idx (parsed as j) into m->n[idx].gen / gen_len, once the
 * layouts of the files it lists are built. Entries naming no file or no tensor are reported as
 * warnings through m's log. Returns 0, or -1 with e set. */
int tp_index_rewrite(tp_model *m, uint32_t idx, const struct cJSON *j, tp_err *e);

#endif
