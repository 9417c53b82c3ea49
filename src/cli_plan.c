/* cli_plan.c: `tpfs plan`, the dry run (see cli.h): plans SRC for T ranks exactly as a mount
 * would, with every tensor that cannot be cut reported (not only the first), and prints, for one
 * rank, every tensor's rule, split, full and local shape and local bytes, then the per-rank
 * totals, the routed experts each rank holds under --ep, the per-rank config counts and the
 * unmatched tensors; or, with --json, the resolved plan as a plan file; or, with --io, what each
 * rank must read from the source (io_plan.h). Nothing is mounted.
 */
#include <cjson/cJSON.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "fs.h"
#include "io_plan.h"
#include "model.h"
#include "rank_folder.h"

typedef struct plan_row {
	int rule, experts;
	char why[160];
	tp_spec spec;
	uint64_t logical;
} plan_row;

typedef struct plan_ctx {
	plan_row **rows; /* [node][tensor] */
	uint32_t cap;
} plan_ctx;

static void on_tensor(void *vctx, const struct tp_model *m, uint32_t node, uint32_t tensor, const tp_resolved *res)
{
	plan_ctx *pc = vctx;
	if (!pc->rows) {
		pc->cap = m->tree.nn;
		pc->rows = calloc(pc->cap, sizeof *pc->rows);
	}
	if (!pc->rows)
		return;
	if (!pc->rows[node])
		pc->rows[node] = calloc(m->tree.n[node].h.n, sizeof **pc->rows);
	if (!pc->rows[node])
		return;
	plan_row *r = &pc->rows[node][tensor];
	r->rule = res->rule;
	r->experts = res->experts;
	r->spec = res->spec;
	r->logical = res->logical;
	snprintf(r->why, sizeof r->why, "%s", res->why);
}

static void plan_log(void *ctx, int level, const char *msg)
{
	(void)ctx;
	if (level != 0 || tp_log_shown(msg))
		fprintf(stderr, "tpfs: %s: %s\n", level == 0 ? "warning" : level == 2 ? "error" : "info", msg);
}

static void shape_str(char *b, size_t n, uint32_t nd, const uint64_t *s)
{
	size_t w = (size_t)snprintf(b, n, "[");
	for (uint32_t i = 0; i < nd && w < n; i++)
		w += (size_t)snprintf(b + w, n - w, "%s%llu", i ? ", " : "", (unsigned long long)s[i]);
	if (w < n)
		snprintf(b + w, n - w, "]");
}

static char *human(uint64_t b, char *buf, size_t n)
{
	const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
	double v = (double)b;
	int k = 0;
	while (v >= 1024 && k < 4) {
		v /= 1024;
		k++;
	}
	snprintf(buf, n, k ? "%.2f %s" : "%.0f %s", v, u[k]);
	return buf;
}

static void print_json_plan(const tp_model *m, plan_ctx *pc)
{
	cJSON *o = cJSON_CreateObject();
	char name[300];
	snprintf(name, sizeof name, "%s-resolved", m->plan.name);
	cJSON_AddNumberToObject(o, "tpfs_plan", 1);
	cJSON_AddStringToObject(o, "name", name);
	char desc[600];
	snprintf(desc, sizeof desc, "Resolved from plan %s for %s: one exact rule per tensor, T-independent.",
		 m->plan_origin, m->src);
	cJSON_AddStringToObject(o, "description", desc);
	if (m->plan.nprefix) /* where the per_rank keys are (each rank's config.json) */
		cJSON_AddItemToObject(o, "config_prefix", cJSON_CreateStringArray(m->plan.prefix, m->plan.nprefix));
	if (m->plan.nper_rank) {
		cJSON *pr = cJSON_AddArrayToObject(o, "per_rank");
		for (int i = 0; i < m->plan.nper_rank; i++) {
			cJSON *q = cJSON_CreateObject();
			cJSON_AddStringToObject(q, "key", m->plan.per_rank[i].key);
			if (m->plan.per_rank[i].groups)
				cJSON_AddTrueToObject(q, "groups");
			if (m->plan.per_rank[i].uneven)
				cJSON_AddTrueToObject(q, "uneven");
			if (m->plan.per_rank[i].vocab)
				cJSON_AddTrueToObject(q, "vocab");
			if (m->plan.per_rank[i].value)
				cJSON_AddStringToObject(q, "value", m->plan.per_rank[i].value);
			cJSON_AddItemToArray(pr, q);
		}
	}
	cJSON *rules = cJSON_AddArrayToObject(o, "rules");
	/* longest names first, so that no exact rule also catches another tensor as its role */
	for (uint32_t i = m->tree.nn; i-- > 0;) {
		const tp_node *n = &m->tree.n[i];
		if (n->kind != TN_TENSORS || !pc->rows || !pc->rows[i])
			continue;
		for (size_t k = n->h.n; k-- > 0;) {
			const st_tensor *t = &n->h.t[n->h.by_name[k]];
			const plan_row *r = &pc->rows[i][n->h.by_name[k]];
			if (r->rule == TP_RULE_EXPERTS)
				continue; /* placed by the experts declarations below (--ep) */
			cJSON *j = cJSON_CreateObject();
			cJSON_AddStringToObject(j, "match", t->name);
			if (r->spec.kind != TP_SPLIT) {
				cJSON_AddStringToObject(j, "split", "replicate");
			} else {
				cJSON_AddStringToObject(j, "split", "axis");
				cJSON_AddNumberToObject(j, "axis", r->spec.axis);
				cJSON_AddNumberToObject(j, "unit", (double)r->spec.unit);
				cJSON_AddNumberToObject(j, "size", (double)r->logical);
				cJSON_AddNumberToObject(j, "div", (double)r->spec.div);
				if (r->spec.nseg > 1) {
					cJSON *sg = cJSON_AddArrayToObject(j, "segments");
					for (uint32_t s = 0; s < r->spec.nseg; s++) {
						uint64_t u = r->spec.segu[s] ? r->spec.segu[s] : r->spec.unit;
						cJSON *so = cJSON_CreateObject();
						cJSON_AddNumberToObject(so, "size", (double)(r->spec.seg[s] * u));
						cJSON_AddNumberToObject(so, "unit", (double)u);
						cJSON_AddItemToArray(sg, so);
					}
				}
				if (r->spec.flags & TP_UNEVEN)
					cJSON_AddTrueToObject(j, "uneven");
				if (r->spec.flags & TP_GROUPS)
					cJSON_AddTrueToObject(j, "groups");
				if (r->rule >= 0 && m->plan.rules[r->rule].vocab)
					cJSON_AddTrueToObject(j, "vocab");
			}
			cJSON_AddItemToArray(rules, j);
		}
	}
	if (m->plan.nexperts) /* the routed experts, for --ep (as the digest holds them: rank_folder.h) */
		cJSON_AddItemToObject(o, "experts", tp_experts_json(&m->plan));
	char *s = cJSON_Print(o);
	if (s)
		puts(s);
	free(s);
	cJSON_Delete(o);
}

/* Which routed experts each rank holds under --ep, and their tensors and bytes per rank. */
static void print_ep(const tp_model *m)
{
	if (m->D > 1) { /* --dp: EP ranks of D x T, vLLM's linear placement with its remainder rule */
		printf("\nexpert parallelism (--ep --dp %u): EP rank g = DP rank x %u + TP rank of %u holds routed experts "
		       "[g*b + min(g, E mod %u), ...) whole, b = E / %u, one more on the first E mod %u ranks\n", m->D, m->T,
		       tp_model_ranks(m), tp_model_ranks(m), tp_model_ranks(m), tp_model_ranks(m));
		printf("  %llu expert tensors placed\n%-8s %-6s %-6s %s\n", (unsigned long long)m->ep_tensors, "ep_rank",
		       "dp", "tp", "experts");
		for (uint32_t g = 0; g < tp_model_ranks(m); g++) {
			printf("%-8u %-6u %-6u", g, g / m->T, g % m->T);
			for (int d = 0; d < m->plan.nexperts; d++) {
				uint64_t first, count;
				int seen = 0;
				for (int k = 0; k < d; k++)
					seen |= m->ep_count[k] == m->ep_count[d];
				tp_model_ep_range(m, d, g, &first, &count);
				if (!seen && count)
					printf(" %llu-%llu", (unsigned long long)first, (unsigned long long)(first + count - 1));
			}
			printf("\n");
		}
		return;
	}
	printf("\nexpert parallelism (--ep): rank r holds routed experts [r*E/N, (r+1)*E/N) whole, and no other\n");
	for (int d = 0; d < m->plan.nexperts; d++)
		if (m->ep_count[d] > 0)
			printf("  experts '%s' of plan %s: E = %lld ('%s'), %lld per rank\n", m->plan.experts[d].name,
			       m->plan.name, (long long)m->ep_count[d], m->plan.experts[d].count,
			       (long long)(m->ep_count[d] / m->T));
	printf("  %llu expert tensors placed\n%-6s %-24s %14s %14s\n", (unsigned long long)m->ep_tensors, "rank", "experts",
	       "tensors", "bytes");
	for (uint32_t r = 0; r < m->T; r++) {
		uint64_t nt = 0, by = 0, first, count;
		for (uint32_t i = 0; i < m->tree.nn; i++)
			if (m->tree.n[i].kind == TN_TENSORS && m->tree.n[i].lay) {
				nt += m->tree.n[i].lay[r].nexpert;
				by += m->tree.n[i].lay[r].expert_bytes;
			}
		char ex[64] = "", hb[32];
		size_t w = 0;
		for (int d = 0; d < m->plan.nexperts && w < sizeof ex; d++) {
			int seen = 0; /* declarations of the same E place the same experts; E = 0: unsized */
			for (int k = 0; k < d; k++)
				seen |= m->ep_count[k] == m->ep_count[d];
			tp_model_ep_range(m, d, r, &first, &count);
			if (seen || !count)
				continue;
			snprintf(ex + w, sizeof ex - w, "%s%llu-%llu", w ? " " : "", (unsigned long long)first,
				 (unsigned long long)(first + count - 1));
			w += strlen(ex + w);
		}
		printf("%-6u %-24s %14llu %14s\n", r, ex, (unsigned long long)nt, human(by, hb, sizeof hb));
	}
}

/* For the ranks sel names: the bytes of the files they are served (the rank folders' tensor files,
 * or under a view its part files) in *files, and in *sum the union of the source bytes those
 * files read and the pages holding them. */
static int io_need(const tp_model *m, const uint8_t *sel, uint64_t page, tp_io_need *sum, uint64_t *files, tp_err *e)
{
	*sum = (tp_io_need){0, 0};
	*files = 0;
	if (m->view) {
		static const uint32_t none[1];
		const uint32_t W = tp_model_ranks(m);
		const size_t np = tp_model_view_parts(m), nf = (size_t)W * (np ? np : 1);
		tp_io_need *per = calloc(m->tree.nn ? m->tree.nn : 1, sizeof *per);
		const uint32_t **node = calloc(nf, sizeof *node);
		tp_served *vs = calloc(nf, sizeof *vs); /* the part files' layouts (copies that only are read) */
		if (!per || !node || !vs) {
			free(per);
			free(node);
			free(vs);
			return tp_fail(e, TP_ENOMEM, "out of memory");
		}
		for (uint32_t g = 0; g < W; g++) /* each part file and its table of sources (empty slots: none read) */
			for (size_t k = 0; k < np; k++) {
				tp_view_file vf;
				node[(size_t)g * np + k] = none;
				if (!tp_model_view_file(m, g, k, &vf))
					continue;
				vs[(size_t)g * np + k] = *vf.layout;
				node[(size_t)g * np + k] = vf.nodes;
				*files += sel[g] ? vf.layout->size : 0;
			}
		int rc = tp_io_need_served(vs, W, np, sel, node, m->tree.nn, page, per, e);
		free(node);
		free(vs);
		if (rc < 0) {
			free(per);
			return -1;
		}
		for (uint32_t i = 0; i < m->tree.nn; i++)
			sum->bytes += per[i].bytes, sum->pages += per[i].pages;
		free(per);
		return 0;
	}
	for (uint32_t i = 0; i < m->tree.nn; i++) {
		if (m->tree.n[i].kind != TN_TENSORS)
			continue;
		tp_io_need need;
		if (tp_io_need_of(m->tree.n[i].lay, m->T, sel, page, &need, e) < 0)
			return -1;
		sum->bytes += need.bytes;
		sum->pages += need.pages;
		for (uint32_t q = 0; q < m->T; q++)
			*files += sel[q] ? m->tree.n[i].lay[q].size : 0;
	}
	return 0;
}

/* tpfs plan --io: per rank and for the selected set, served file bytes (rank folders, or the
 * view's part files), source run bytes and the page-touch minimum (pages of this machine's page
 * size). */
static int print_io(const tp_model *m, const uint8_t *sel, uint32_t nsel, const char *ranks, tp_err *e)
{
	uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE), src = 0;
	uint8_t one[TP_MAX_T] = {0};
	char a[32], b[32], c[32];
	for (uint32_t i = 0; i < m->tree.nn; i++)
		src += m->tree.n[i].kind == TN_TENSORS ? m->tree.n[i].src_size : 0;
	printf("source: %s\nplan:   %s\n", m->src, m->plan_origin);
	if (m->view)
		printf("view:   %s (the part files each rank's loader reads)\n", m->view->origin);
	uint32_t R = tp_model_ranks(m); /* view ranks: P x T with stages */
	if (m->P > 1)
		printf("ranks:  %u (%u stages x %u; rank = stage x %u + TP rank)\npage:   %llu bytes\n\n", R, m->P, m->T, m->T,
		       (unsigned long long)page);
	else if (m->D > 1)
		printf("ranks:  %u (%u DP ranks x %u; rank = DP rank x %u + TP rank)\npage:   %llu bytes\n\n", R, m->D, m->T,
		       m->T, (unsigned long long)page);
	else
		printf("ranks:  %u\npage:   %llu bytes\n\n", R, (unsigned long long)page);
	printf("%-8s %16s %16s %16s %10s\n", "rank", m->view ? "part_files" : "rank_files", "source_runs", "page_touch_min",
	       "x_files");
	tp_io_need set = {0, 0};
	uint64_t set_files = 0;
	for (uint32_t r = 0; r <= R; r++) {
		int total = r == R;
		if (!total && !sel[r])
			continue;
		if (!total)
			one[r] = 1;
		tp_io_need sum = {0, 0};
		uint64_t files = 0;
		if (io_need(m, total ? sel : one, page, &sum, &files, e) < 0)
			return -1;
		if (!total)
			one[r] = 0;
		else
			set = sum, set_files = files;
		char name[16];
		snprintf(name, sizeof name, "%u", r);
		printf("%-8s %16llu %16llu %16llu %9.2fx\n", total ? "served" : name, (unsigned long long)files,
		       (unsigned long long)sum.bytes, (unsigned long long)(sum.pages * page),
		       files ? (double)(sum.pages * page) / (double)files : 0.0);
	}
	printf("\nserved set: %s (%u of %u ranks): %s %s, page-touch minimum %s of a %s source (%.2fx)\n",
	       ranks ? ranks : "all", nsel, R, m->view ? "part files" : "rank files", human(set_files, a, sizeof a),
	       human(set.pages * page, b, sizeof b),
	       human(src, c, sizeof c), src ? (double)(set.pages * page) / (double)src : 0.0);
	return 0;
}

/* --view: rank's part files, each served tensor with its local shape and the source tensors it is
 * made of (concatenated, stacked, or a constant; widened, transposed, zeros off rank 0). */
static void print_view(const tp_model *m, uint32_t rank)
{
	printf("source: %s\nplan:   %s\nview:   %s (%s)\n", m->src, m->plan_origin, m->view->origin,
	       m->view->proven ? m->view->proven : "not proven");
	if (m->P > 1) {
		printf("ranks:  %u: %u pipeline stages x %u (showing rank %u: stage %u, TP rank %u)\nstages:", tp_model_ranks(m), m->P, m->T,
		       rank, rank / m->T, rank % m->T);
		for (uint32_t s = 0; s < m->P; s++) {
			uint64_t a, b;
			tp_model_stage_layers(m, s, &a, &b);
			printf("%s %u: layers [%llu, %llu)%s%s", s ? "," : "", s, (unsigned long long)a, (unsigned long long)b,
			       s == 0 ? " + first" : "", s == m->P - 1 ? " + last" : "");
		}
		printf("\n\n");
	} else if (m->D > 1) {
		printf("ranks:  %u: %u DP ranks x %u (showing rank %u: DP rank %u, TP rank %u; its experts those of EP rank "
		       "%u of %u)\n\n", tp_model_ranks(m), m->D, m->T, rank, rank / m->T, rank % m->T, rank, tp_model_ranks(m));
	} else {
		printf("ranks:  %u (showing rank %u)\n\n", m->T, rank);
	}
	printf("%-60s %-6s %-22s %12s  %s\n", "served tensor", "dtype", "local shape", "local bytes", "made of");
	size_t nf = 0;
	uint64_t total = 0;
	tp_view_file vf;
	for (size_t k = 0; tp_model_view_file(m, rank, k, &vf); k++, nf++) {
		const tp_vpart *pt = vf.vpart;
		const tp_served *S = vf.layout;
		char fname[96], a[32];
		tp_model_view_name(m, rank, k, fname, sizeof fname);
		printf("-- %s (%s, from %s)\n", fname, human(S->size, a, sizeof a), m->tree.n[vf.own].path);
		total += S->size;
		for (size_t j0 = 0; j0 < S->n; j0++) {
			const tp_stensor *t = &S->t[j0];
			const tp_sdesc *d = NULL;
			for (size_t j = 0; j < pt->n && !d; j++) /* a listing, not a hot path */
				if (pt->d[j].name == t->name || !strcmp(pt->d[j].name, t->name))
					d = &pt->d[j];
			char sh[64], made[512] = "";
			shape_str(sh, sizeof sh, t->ndim, t->shape);
			size_t w = 0;
			if (d && d->cbytes)
				w += (size_t)snprintf(made, sizeof made, "constant");
			else if (d && d->nstack)
				w += (size_t)snprintf(made, sizeof made, "stack of %u x ", d->nstack);
			for (uint32_t j = 0; d && !d->cbytes && j < d->npieces && w < sizeof made; j++) {
				const tp_pdesc *pd = &d->pieces[j];
				const st_header *h = &m->tree.n[vf.nodes[pd->file]].h;
				w += (size_t)snprintf(made + w, sizeof made - w, "%s%s", j ? " + " : "", h->t[pd->tensor].name);
				if (pd->deint && w < sizeof made)
					w += (size_t)snprintf(made + w, sizeof made - w, " (rows deinterleaved by %llu)",
							      (unsigned long long)pd->deint);
			}
			if (d && d->to_f32 && w < sizeof made)
				w += (size_t)snprintf(made + w, sizeof made - w, " (widened to F32)");
			if (d && d->transpose && w < sizeof made)
				w += (size_t)snprintf(made + w, sizeof made - w, " (last two axes swapped)");
			if (d && d->rank0_only && w < sizeof made)
				w += (size_t)snprintf(made + w, sizeof made - w, rank % m->T ? " (zeros: TP rank 0 serves it)" : " (TP rank 0 only)");
			printf("%-60s %-6s %-22s %12llu  %s\n", t->name, st_dtype_name(t->dtype), sh, (unsigned long long)t->size,
			       made);
		}
	}
	char a[32];
	printf("\nrank %u: %zu part files, %s\n", rank, nf, human(total, a, sizeof a));
	if (m->D > 1) /* --dp: which experts every EP rank holds */
		print_ep(m);
}

int cmd_plan(int argc, char **argv)
{
	static const struct option lo[] = {
		{"tp", required_argument, 0, 't'}, {"rank", required_argument, 0, 'r'}, {"json", no_argument, 0, 'j'},
		{"plan", required_argument, 0, 'p'}, {"strict", no_argument, 0, 's'},
		{"unmatched", required_argument, 0, 'U'},
		{"pad-vocab", optional_argument, 0, 'V'}, {"list", no_argument, 0, 'l'}, {"help", no_argument, 0, 'h'},
		{"io", no_argument, 0, 'i'}, {"ranks", required_argument, 0, 'K'}, {"ep", optional_argument, 0, 'E'},
		{"view", required_argument, 0, 'W'}, {"pp", required_argument, 0, 'Q'},
		{"pp-layers", required_argument, 0, 'G'}, {"dp", required_argument, 0, 'A'}, {0, 0, 0, 0}};
	const char *ranks = NULL;
	int io = 0;
	plan_ctx pc = {0};
	tp_model_opts mo = {.log = plan_log, .on_tensor = on_tensor, .ctx = &pc, .keep_going = 1};
	uint32_t rank = 0;
	int json = 0, have_t = 0, c;
	while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
		int k = model_option(c, optarg, &mo, &have_t, usage_plan);
		if (k == 2)
			return 2;
		if (k == 1)
			continue;
		switch (c) {
		case 'r':
			if (parse_u32(optarg, &rank) < 0)
				return die_usage(usage_plan, "--rank: give a rank number");
			break;
		case 'j': json = 1; break;
		case 'i': io = 1; break;
		case 'K':
			if (ranks)
				return die_usage(usage_plan, "--ranks given twice: give one list, e.g. --ranks 0,1");
			ranks = optarg;
			break;
		case 'l':
			for (int i = 0; i < tp_builtin_count(); i++) {
				size_t len;
				cJSON *p = cJSON_Parse(tp_builtin_text(i, &len));
				const cJSON *d = cJSON_GetObjectItemCaseSensitive(p, "description");
				const cJSON *mt = cJSON_GetObjectItemCaseSensitive(
					cJSON_GetObjectItemCaseSensitive(p, "detect"), "model_type");
				printf("%-16s %s\n%-16s model types: ", tp_builtin_name(i),
				       cJSON_IsString(d) ? d->valuestring : "", "");
				int k = 0;
				const cJSON *it;
				cJSON_ArrayForEach(it, mt) if (cJSON_IsString(it)) printf("%s%s", k++ ? ", " : "", it->valuestring);
				puts(k ? "" : "none (only with --plan generic)");
				cJSON_Delete(p);
			}
			return 0;
		case 'h': fputs(usage_plan, stdout); return 0;
		default: return die_usage(usage_plan, NULL);
		}
	}
	if (argc - optind != 1)
		return die_usage(usage_plan, "give SRC");
	if (!have_t)
		return die_usage(usage_plan, "--tp N is required");
	if (model_options_check(&mo, usage_plan))
		return 2;
	/* view ranks: stage (or DP rank) x T + TP rank */
	uint64_t nr64 = (uint64_t)mo.T * (mo.pp > 1 && mo.view ? mo.pp : 1) * (mo.dp > 1 && mo.view ? mo.dp : 1);
	if (nr64 > TP_MAX_T)
		return die_usage(usage_plan, "--pp x --dp x --tp: at most 1024 ranks in all");
	uint32_t nranks = (uint32_t)nr64;
	if (rank >= nranks)
		return die_usage(usage_plan, mo.pp > 1 ? "--rank must be below --tp x --pp" : mo.dp > 1 ?
				 "--rank must be below --tp x --dp" : "--rank must be below --tp");
	uint8_t sel[TP_MAX_T];
	uint32_t nsel = nranks > TP_MAX_T ? TP_MAX_T : nranks;
	memset(sel, 1, sizeof sel);
	if (ranks) {
		tp_err re;
		if (!io)
			return die_usage(usage_plan, "--ranks goes with --io");
		if (tp_ranks_parse(ranks, nsel, sel, &nsel, &re) < 0)
			return die_usage(usage_plan, re.msg);
	}
	mo.src = argv[optind];
	tp_model m;
	tp_err e;
	int rc = tp_model_open(&m, &mo, &e);
	tp_log_repeats();
	if (rc < 0) {
		fprintf(stderr, "tpfs: %s\n", e.msg);
		goto out;
	}
	if (m.view && !json && !io) {
		print_view(&m, rank);
	} else if (io) {
		if (print_io(&m, sel, nsel, ranks, &e) < 0) {
			fprintf(stderr, "tpfs: %s\n", e.msg);
			rc = -1;
		}
	} else if (json) {
		print_json_plan(&m, &pc);
	} else {
		printf("source: %s\nplan:   %s\nranks:  %u (showing rank %u)\n\n", m.src, m.plan_origin, m.T, rank);
		printf("%-56s %-10s %-44s %-22s %-22s %12s\n", "tensor", "rule", "split", "full shape", "local shape", "local bytes");
		for (uint32_t i = 0; i < m.tree.nn; i++) {
			const tp_node *n = &m.tree.n[i];
			if (n->kind != TN_TENSORS)
				continue;
			printf("-- %s\n", n->path);
			const tp_layout *L = &n->lay[rank];
			for (size_t k = 0; k < n->h.n; k++) {
				const st_tensor *t = &n->h.t[k];
				const plan_row *r = pc.rows && pc.rows[i] ? &pc.rows[i][k] : NULL;
				char fs[64], ls[64];
				shape_str(fs, sizeof fs, t->ndim, t->shape);
				uint32_t li = L->loc[k];
				uint64_t lsh[ST_MAX_DIMS];
				if (li == UINT32_MAX) {
					snprintf(ls, sizeof ls, "(absent)");
				} else {
					uint32_t nd = tp_layout_shape(L, &L->t[li], lsh);
					shape_str(ls, sizeof ls, nd, lsh);
				}
				printf("%-56s %-10s %-44s %-22s %-22s %12llu\n", t->name,
				       r && r->rule >= 0 ? m.plan.rules[r->rule].name
				       : r && r->rule == TP_RULE_EXPERTS ? m.plan.experts[r->experts].name : "-",
				       r ? r->why : "?", fs, ls,
				       (unsigned long long)(li == UINT32_MAX ? 0 : L->t[li].size));
			}
		}
		printf("\n%-6s %14s %14s %14s %14s\n", "rank", "local", "replicated", "split", "files");
		for (uint32_t r = 0; r < m.T; r++) {
			uint64_t loc = 0, rep = 0, spl = 0, fsz = 0;
			for (uint32_t i = 0; i < m.tree.nn; i++) {
				if (m.tree.n[i].kind != TN_TENSORS)
					continue;
				loc += m.tree.n[i].lay[r].data_size;
				rep += m.tree.n[i].lay[r].repl_bytes;
				spl += m.tree.n[i].lay[r].split_bytes;
				fsz += m.tree.n[i].lay[r].size;
			}
			char a[32], b[32], cc[32], d[32];
			printf("%-6u %14s %14s %14s %14s\n", r, human(loc, a, sizeof a), human(rep, b, sizeof b),
			       human(spl, cc, sizeof cc), human(fsz, d, sizeof d));
			if (m.T > 16 && r == 7 && m.T > 9) {
				printf("...\n");
				r = m.T - 2;
			}
		}
		if (mo.ep)
			print_ep(&m);
		char a[32];
		printf("source: %llu tensors in %llu files, %s of tensor data\n", (unsigned long long)m.ntensors,
		       (unsigned long long)m.ntensor_files, human(m.src_bytes, a, sizeof a));
		if (m.plan.nper_rank) {
			printf("per-rank config counts (rank %u):", rank);
			for (int i = 0; i < m.plan.nper_rank; i++) {
				int64_t lv = tp_model_rank_count(&m, &m.plan.per_rank[i], rank);
				if (lv >= 0)
					printf(" %s=%lld", m.plan.per_rank[i].key, (long long)lv);
			}
			printf("\n");
		}
		printf("unmatched tensors (%s): %llu\n", mo.unmatched_replicate && !mo.strict ? "replicated" : "refused",
		       (unsigned long long)m.nunmatched);
		int shown = 0;
		for (uint32_t i = 0; i < m.tree.nn && shown < 50; i++)
			for (size_t k = 0; pc.rows && pc.rows[i] && k < m.tree.n[i].h.n && shown < 50; k++)
				if (pc.rows[i][k].rule == -1) {
					printf("  %s (%s)\n", m.tree.n[i].h.t[k].name, m.tree.n[i].path);
					shown++;
				}
		if (m.nunmatched > 50)
			printf("  ... and %llu more\n", (unsigned long long)(m.nunmatched - 50));
	}
	if (m.nrefused) {
		fprintf(stderr, "tpfs: %llu tensor%s cannot be split %u ways (the errors above name each one); "
				"a mount at this T would be refused\n",
			(unsigned long long)m.nrefused, m.nrefused == 1 ? "" : "s", m.T);
		rc = -1;
	}
	tp_model_close(&m);
out:
	for (uint32_t i = 0; pc.rows && i < pc.cap; i++)
		free(pc.rows[i]);
	free(pc.rows);
	return rc < 0 ? 1 : 0;
}
