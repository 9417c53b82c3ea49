/* srctree.h: the source tree, SRC walked into nodes (srctree.c), and the limits of that walk.
 *
 * tp_srctree_open walks SRC (following symbolic links, so a Hugging Face snapshot folder works)
 * into an array of nodes, folders before their entries and every folder's entries in name order:
 * links resolved before any mount exists (a link into the mount point refused), link loops,
 * dangling links and special files skipped with a warning, paths past PATH_MAX left out by name,
 * the named limits enforced. A node also carries what planning hangs on it (its header, layouts,
 * rewrites: model.h fills those); this room only walks, finds and frees the walk's part. It knows
 * nothing of the model: the model (model.c) and the engine view (model_view.c) build on it.
 */
#ifndef TP_SRCTREE_H
#define TP_SRCTREE_H

#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>

#include "layout.h"
#include "spec.h"
#include "st_format.h"
#include "tp_err.h"

#define TP_MAX_NODES 1000000       /* files and folders in SRC */
#define TP_MAX_DIR_ENTRIES 100000  /* entries of one folder */
#define TP_MAX_DEPTH 64            /* folder nesting */

typedef enum tp_node_kind {
	TN_DIR,     /* a folder */
	TN_TENSORS, /* a valid safetensors file, served per rank from its layouts */
	TN_INDEX,   /* a *.safetensors.index.json, rewritten per rank */
	TN_PLAIN,   /* any other file (or an unneeded invalid one), served unchanged */
	TN_CONFIG,  /* the root's config.json, rewritten per rank (rank_folder.h) */
} tp_node_kind;

typedef struct tp_node {
	const char *name;          /* last path component; "" for the root */
	char *path;                /* path relative to SRC (for messages); "" for the root */
	char *abspath;             /* path under SRC as given, for opening */
	uint32_t parent;           /* the root is its own parent */
	tp_node_kind kind;
	uint32_t *child;           /* children sorted by name (bytewise) */
	uint32_t nchild;
	struct timespec mtime;     /* of the source (folders and files) */
	uint64_t src_size;         /* files: bytes of the source */
	dev_t dev;
	ino_t ino;
	mode_t mode;               /* of the file or folder actually read (a link's target) */
	uid_t uid;
	gid_t gid;
	struct timespec ctime;     /* of the source at planning */
	char *real;                /* abspath with every symbolic link resolved (at planning, before
	                            * any mount exists): what the filesystem stats and opens */
	/* filled by planning (model.c), freed by tp_model_close */
	int needed;                /* tensors: at the top level or listed by an index */
	char *error;               /* why a safetensors file was not planned (check), or NULL */
	/* TN_TENSORS */
	int fd;                    /* open read-only, or -1 */
	const uint8_t *map;        /* read-only shared mapping of src_size bytes, or NULL */
	st_header h;
	tp_layout *lay;            /* T layouts */
	tp_spec *specs;            /* --view: h.n specs, the plan's (the view cuts pieces with them) */
	/* TN_INDEX, TN_CONFIG */
	char **gen;                /* T rewritten files */
	uint64_t *gen_len;
} tp_node;

/* SRC walked: n[0] is the root (its abspath is SRC as given). */
typedef struct tp_srctree {
	tp_node *n;
	uint32_t nn, cap;
} tp_srctree;

/* Walks the folder src into *t (zeroed first): the root, then every entry below it, each node's
 * kind from its name (TN_TENSORS, TN_INDEX, TN_PLAIN) or TN_DIR, fd -1. mnt: the mount point
 * (absolute, resolved), or NULL: a node whose resolved path leads into it is refused. Warnings
 * (skipped entries) go to log (level 0). Returns 0, or -1 with e set naming the path (not a
 * folder, a named limit, a link into the mount point, out of memory); *t then holds what was
 * walked, for tp_srctree_free. */
int tp_srctree_open(tp_srctree *t, const char *src, const char *mnt, tp_log_fn log, void *log_ctx, tp_err *e);

/* Frees the walk's part of every node (names, paths, children) and the nodes; the caller frees
 * what it hung on them first. *t is zeroed. */
void tp_srctree_free(tp_srctree *t);

/* The child of folder node dir called name, or UINT32_MAX. O(log n). */
uint32_t tp_node_child(const tp_srctree *t, uint32_t dir, const char *name);

/* The node a relative path (as an index's weight_map gives it: "a/b.safetensors", "../x") leads
 * to from folder dir, or UINT32_MAX. */
uint32_t tp_node_resolve(const tp_srctree *t, uint32_t dir, const char *rel);

#endif
