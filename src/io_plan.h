/* io_plan.h: what a set of served ranks must read from the source, and rank lists.
 *
 * A node of a multi-node job serves some ranks of a T-way split (`--ranks 8-15`). What it costs
 * is the bytes it pulls from (shared) storage. The least a page-granular reader can fetch is the
 * page-touch minimum: the source pages holding at least one byte of the served ranks' source
 * runs (the union over those ranks, so a replicated tensor or a page two ranks share counts
 * once). This module computes it from the layouts, without reading any data, and turns a
 * read's runs into the page ranges to prefetch (each range of one source: a served file reads
 * several, see served.h). It also parses rank lists. Pure: no I/O.
 */
#ifndef TP_IO_PLAN_H
#define TP_IO_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "layout.h"
#include "served.h"
#include "tp_err.h"

/* Parses a rank list of a T-way split: comma-separated ranks and inclusive ranges ("8-15",
 * "0,3", "0-3,8"). Fills sel[0..T) with 1 for each named rank and 0 otherwise, and *count with
 * the number named. Refuses an empty list or item, anything but digits, '-' and ',', a range
 * whose end is below its start, a rank >= T, and a rank named twice. Returns 0, or -1 with a
 * message that quotes the list and says which rule it breaks. */
int tp_ranks_parse(const char *list, uint32_t T, uint8_t *sel, uint32_t *count, tp_err *e);

/* Source reads of one file for a set of ranks. */
typedef struct tp_io_need {
	uint64_t bytes; /* source bytes in at least one selected rank's runs (the byte-exact minimum) */
	uint64_t pages; /* pages of `page` bytes holding at least one of those bytes */
} tp_io_need;

/* The union over the ranks r < T with sel[r] (sel NULL: all) of the source runs of lay[r]
 * (the T layouts of one source file, all built from the same header), measured in bytes and in
 * pages of `page` bytes (a power of two) of the source file. Header runs and zero fill read
 * nothing. Cost: O(rows x pieces) per tensor, no allocation unless the selected layouts disagree
 * on a tensor's row structure (they do not for layouts built by tp_layout_build). Returns 0, or
 * -1 (out of memory) with e set. */
int tp_io_need_of(const tp_layout *lay, uint32_t T, const uint8_t *sel, uint64_t page, tp_io_need *out,
		  tp_err *e);

/* The same for a view's part files: vs[r * np + p] is rank r's part p, whose table of sources
 * is node[r * np + p][0 .. its nsrc) (each a source number below nnodes). For each
 * source g, out[g] (nnodes entries) receives the union over the ranks r < T with sel[r] (sel
 * NULL: all) of every part's cuts of it: a source tensor two parts or two ranks read counts once.
 * Constants read nothing; a widened part counts the source bytes it widens. Returns 0, or -1 (out
 * of memory) with e set. */
int tp_io_need_served(const tp_served *vs, uint32_t T, size_t np, const uint8_t *sel, const uint32_t *const *node,
		      uint32_t nnodes, uint64_t page, tp_io_need *out, tp_err *e);

/* A page-aligned range [lo, hi) of the bytes of source `src` (the runs' source index; 0 for
 * a layout). */
typedef struct tp_io_range {
	uint64_t lo, hi;
	uint32_t src;
} tp_io_range;

/* Where tp_io_ranges stopped: at runs[run], of which (a TP_RUN_TRANSPOSE run) the first `cut`
 * bytes of its cut span (tp_run_t_span) are planned already. Start from {0, 0}. */
typedef struct tp_io_at {
	size_t run;
	uint64_t cut;
} tp_io_at;

/* Turns runs of one source (as tp_map emits them; only runs that read a source count, a
 * TP_RUN_WIDEN one by the source bytes it widens, a TP_RUN_TRANSPOSE one by the cut rows of its
 * matrices (tp_run_t_span), not the other ranks' bytes between them; their src is not read and
 * the ranges name source 0) into page-aligned ranges of `page` bytes (a power of two), in order,
 * merging a range into the previous one when they overlap or touch. Plans from *at and writes at
 * most cap ranges (cap >= 1), advancing *at past what they cover: done when at->run == nr, else
 * call again (each call advances *at: a transposed run whose rows leave whole pages between them
 * gives a range per row, and may take several calls). Returns the number of ranges. */
size_t tp_io_ranges(const tp_run *runs, size_t nr, uint64_t page, tp_io_range *out, size_t cap, tp_io_at *at);

/* The same for runs of several sources (tp_served_map's): each range names its runs' source,
 * and ranges merge only within one source. */
size_t tp_io_ranges_src(const tp_run *runs, size_t nr, uint64_t page, tp_io_range *out, size_t cap, tp_io_at *at);

/* The page ranges (of `page` bytes, a power of two) to fetch for rank-file bytes [a, b) of L, in
 * order, merged as tp_io_ranges merges: every page of the source runs tp_map gives for [a, b),
 * widened to the whole rows the range cuts into (so a reader that reads the whole file fetches no
 * page outside its page-touch set), without visiting the rows of a tensor whose pieces, row after
 * row, leave gaps under a page (those give one range). cap must be at least TP_MAX_PIECES.
 * *covered receives the rank-file bytes done (less than b - a when cap was reached: call again
 * from there). Returns the number of ranges. */
size_t tp_io_plan(const tp_layout *L, uint64_t a, uint64_t b, uint64_t page, tp_io_range *out, size_t cap,
		  uint64_t *covered);

/* The same for bytes [a, b) of served file S: every page of the source runs tp_served_map gives,
 * each range naming its source, widened and merged as tp_io_plan does for each piece's cut; for a
 * transposed part, the cut rows of every matrix [a, b) reaches (whole matrices: any output row of
 * a matrix reads all its rows). *cut: on entry, the bytes of the cut of the transposed matrix
 * holding byte a that the previous call planned (0 to start); on return, the same for byte
 * a + *covered (nonzero where out filled up inside a transposed matrix whose rows each give a
 * range: call again from there, with *covered 0 possible, *cut then grown). */
size_t tp_served_io_plan(const tp_served *S, uint64_t a, uint64_t b, uint64_t page, tp_io_range *out, size_t cap,
			 uint64_t *covered, uint64_t *cut);

#endif
