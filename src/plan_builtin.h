/* plan_builtin.h: the plan files of plans/ compiled into the binary, as text, and the families
 * examined and not served, with their reasons. Choosing a plan and parsing it is planner.h's; this
 * module only holds the texts and their names. */
#ifndef TP_PLAN_BUILTIN_H
#define TP_PLAN_BUILTIN_H

#include <stddef.h>

/* Number of built-in plans; their order is the order in which "detect" sections are tried. */
int tp_builtin_count(void);
/* Name of built-in plan i (its "name" field), or NULL when i is out of range. */
const char *tp_builtin_name(int i);
/* Text of built-in plan i and its length, or NULL when i is out of range. */
const char *tp_builtin_text(int i, size_t *len);
/* Index of the built-in plan named name, or -1. */
int tp_builtin_find(const char *name);
/* Why model_type is not served, where its model code was examined and found unservable
 * (docs/ARCHITECTURES.md, "Families examined and not served"); NULL for any other name. */
const char *tp_builtin_examined(const char *model_type);

#endif
