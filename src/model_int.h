/* model_int.h: what the rooms of the model (model.c, model_walk.c, model_view.c) offer each other
 * and nothing else: walking SRC into nodes, and the engine view's steps of tp_model_open. Users of
 * a model include model.h; only these three files include this.
 */
#ifndef TP_MODEL_INT_H
#define TP_MODEL_INT_H

#include <stdint.h>

#include "tp_err.h"

/* Declared here, defined in model.h (which this header does not include: the model's rooms
 * include both, and the include check sees no circle). */
struct cJSON;
struct stat;
struct tp_model;

/* Walking SRC (model_walk.c, for tp_model_open): adds node (rel, abs, kind, st) under parent into
 * *out (kind: a tp_node_kind), resolving its links; and adds folder dir's entries and recurses (depth: of dir). 0 or -1
 * with e set (a named limit, a link into the mount point, out of memory). */
int tp_model_add_node(struct tp_model *m, uint32_t parent, const char *rel, const char *abs, int kind,
		      const struct stat *st, uint32_t *out, tp_err *e);
int tp_model_walk(struct tp_model *m, uint32_t dir, int depth, tp_err *e);

/* --view (model_view.c). Before planning: the view chosen for the plan and config.json (refusing
 * what no view serves: another plan, a quantized checkpoint, --ep), and the vocabulary multiple it
 * asks for in m->pad_vocab. After planning: the view resolved over the source files (those the
 * root index lists, else the root's) and every rank's served files built. Free: both undone. */
int tp_model_view_choose(struct tp_model *m, tp_err *e);
int tp_model_view_build(struct tp_model *m, const struct cJSON *root_index, tp_err *e);
void tp_model_view_free(struct tp_model *m);

#endif
