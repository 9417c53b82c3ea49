/* cli.c: the tpfs command line (the thin shell's upper half): argv, help, exit codes.
 *
 *   tpfs mount SRC MNT --tp N [...]   serve SRC as N rank folders under MNT
 *   tpfs umount MNT                   unmount
 *   tpfs plan SRC --tp N [...]        the dry run: every tensor, its rule, full -> local shape
 *   tpfs check SRC                    strict validation of every safetensors file
 *   tpfs stats MNT                    the counters of a mount
 *
 * Exit status: 0 success, 1 the input or the plan was refused (the message says why), 2 usage.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fs.h"
#include "gather_module.h"
#include "io_plan.h"
#include "model.h"
#include "rank_folder.h"

static const char *usage_main =
	"usage: tpfs COMMAND [ARGS]\n"
	"\n"
	"Presents one model checkpoint as per-rank checkpoints for tensor parallelism.\n"
	"MNT/rank{r}/ holds every file of SRC; each .safetensors file there holds rank r's\n"
	"slices of the tensors (local shapes), read lazily from SRC.\n"
	"\n"
	"commands:\n"
	"  mount SRC MNT --tp N   serve SRC as N rank folders under MNT\n"
	"  umount MNT             unmount a tpfs mount\n"
	"  plan SRC --tp N        show how every tensor is split (the dry run)\n"
	"  check SRC              validate every safetensors file strictly\n"
	"  stats MNT              print the counters of a mount\n"
	"\n"
	"'tpfs COMMAND --help' describes each command. 'tpfs --version' prints the version.\n";

static const char *usage_mount =
	"usage: tpfs mount SRC MNT --tp N [options]\n"
	"\n"
	"Mounts MNT with folders rank0 .. rank{N-1}; each holds every file of SRC. Safetensors files\n"
	"hold that rank's slices; *.safetensors.index.json files are rewritten per rank; other files\n"
	"are served unchanged. The plan (how each tensor is split) is chosen from config.json, computed\n"
	"and checked before anything is mounted: a checkpoint that cannot be split N ways is refused\n"
	"with the file, the tensor and the rule. Without -f, tpfs returns once the mount answers.\n"
	"\n"
	"options:\n"
	"  --tp N              number of ranks (tensor-parallel size), 1..1024 (required)\n"
	"  --ranks LIST        serve only these rank folders of the N-way split, e.g. 8-15 or 0,3 (one\n"
	"                      node of a multi-node job; the source is read only for these ranks);\n"
	"                      the folders keep their global numbers (8-15 gives rank8 .. rank15)\n"
	"  --plan NAME|FILE    a built-in plan by name, or a plan file (default: detect from config.json;\n"
	"                      'tpfs plan --list' lists the built-in plans). A model_type no built-in\n"
	"                      plan knows is refused; --plan generic opts in to a guess by tensor name\n"
	"                      that refuses what a name cannot tell (fused or 3-D experts tensors)\n"
	"  --unmatched refuse|replicate  a tensor no rule of the plan matches: refused (default), by\n"
	"                      name and shape, with the per-rank count it would contradict; or\n"
	"                      served whole on every rank (replicate: only for tensors known to be\n"
	"                      whole; a plan rule \"split\": \"replicate\" says so per tensor). A plan\n"
	"                      that config.json's architectures alone picked and whose rules do not\n"
	"                      fit the names is refused as an unknown architecture either way\n"
	"  --strict            refuse tensors no rule matches and invalid files anywhere in SRC\n"
	"  --pad-vocab[=M]     pad vocabulary rows to a multiple of M (default 64, as vLLM) so that\n"
	"                      any N dividing the padded size works; padded rows read as zeros\n"
	"  --config local|global  local (default): each rank's config.json gives its own counts (heads,\n"
	"                      intermediate sizes, vocabulary rows: the plan's per_rank keys), so a\n"
	"                      TP=1 loader builds the served shapes; global: config.json unchanged.\n"
	"                      MNT/config.json is always the source's; safetensors headers say\n"
	"                      tpfs.tp_size, tpfs.tp_rank and tpfs.plan in their __metadata__\n"
	"  --ep                expert parallelism: the routed experts (the plan's \"experts\") are not\n"
	"                      cut; rank r holds experts [r*E/N, (r+1)*E/N) whole (every tensor of\n"
	"                      them: weights, biases, scales) and no other; names keep their global\n"
	"                      index. Everything else is split as without --ep. N must divide E\n"
	"  -f, --foreground    stay in the foreground (log to stderr)\n"
	"  -d, --debug         libfuse debug output; counters at unmount (implies -f)\n"
	"  -o OPTIONS          extra FUSE mount options (comma separated); the mount is always\n"
	"                      ro and default_permissions: each file keeps the owner, group and\n"
	"                      read/execute bits of its source; other users reach the mount only\n"
	"                      with -o allow_other (as a non-root user, that needs user_allow_other\n"
	"                      in /etc/fuse.conf)\n"
	"  --readahead KB      readahead window set on the mount (default 4096: reads arrive as\n"
	"                      1 MiB requests, several in flight; 0 leaves the kernel's 128)\n"
	"  --threads N         worker threads (default 16)\n"
	"  --log FILE          log file in background mode (default: syslog)\n"
	"  --gather MODE       auto, cpu or cuda. cuda gathers every strided read on the GPU and is\n"
	"                      refused when no device is usable; auto (default) uses it only for\n"
	"                      gathers past --cuda-min-runs N and --cuda-min-bytes B, which are unset\n"
	"                      (so: the CPU) until measurements on a GPU machine give them values\n"
	"tuning (docs/PERFORMANCE.md has the measurements behind the defaults):\n"
	"  --reply MODE        auto or copy (default: source bytes are copied into a buffer, then the\n"
	"                      source is checked again before the reply), or iov (replies point into\n"
	"                      the source mapping: the kernel copies after the check, so a read that\n"
	"                      overlaps a write of the source may return a mix of old and new bytes)\n"
	"  --max-background N  FUSE requests in flight for readahead (default 64; the kernel's is 12)\n"
	"  --release-pages on|off  drop the daemon's mapping of source pages after each reply so its\n"
	"                      RSS stays flat (default on; the pages stay in the page cache)\n"
	"  --source-io MODE    exact (default: no readahead on the source, the next runs' pages\n"
	"                      prefetched), readahead (the kernel's) or random (neither; for measuring).\n"
	"                      Pick readahead on stores limited by request count rather than bytes:\n"
	"                      more bytes are read, in fewer and larger requests\n"
	"\n"
	"Unmount with 'tpfs umount MNT', 'fusermount3 -u MNT', or SIGTERM/SIGINT to the daemon.\n";

static const char *usage_plan =
	"usage: tpfs plan SRC --tp N [--rank R] [--json] [--plan NAME|FILE] [--strict] [--unmatched refuse|replicate]\n"
	"                 [--pad-vocab[=M]] [--ep]\n"
	"       tpfs plan SRC --tp N --io [--ranks LIST]\n"
	"       tpfs plan --list\n"
	"\n"
	"Prints, for rank R (default 0), every tensor: the rule that matched, how it is split, its\n"
	"full and local shapes and its local bytes; then per-rank totals (local, replicated, split)\n"
	"and the tensors no rule matched (refused, each named with its shape, unless --unmatched\n"
	"replicate serves them whole). Nothing is mounted.\n"
	"--ep (expert parallelism, as for mount) also prints which routed experts each rank holds.\n"
	"--plan is as for mount: a model_type no built-in plan knows is refused; --plan generic opts\n"
	"in to a guess by tensor name that refuses what a name cannot tell.\n"
	"--json prints the resolved plan as a plan file (one exact rule per tensor) that --plan\n"
	"accepts back, for editing. --list prints the built-in plans.\n"
	"--io prints what each rank must read from the source: its rank files' bytes, the source bytes\n"
	"its runs cover, and the page-touch minimum (the source pages holding any of them: what a\n"
	"reader fetching whole pages reads at least), per rank and for the set --ranks names (all by\n"
	"default; pages shared by ranks counted once).\n";

static const char *usage_check =
	"usage: tpfs check SRC\n"
	"\n"
	"Validates every .safetensors file under SRC against every rule of the format (header size\n"
	"and JSON, dtypes, shapes, offsets that tile the data exactly, file length) and prints one line\n"
	"per file. Exits 1 if any file is invalid.\n";

static const char *usage_umount =
	"usage: tpfs umount [--lazy] MNT\n"
	"\n"
	"Unmounts a tpfs mount (the daemon then exits). --lazy detaches it even while files are open.\n";

static const char *usage_stats = "usage: tpfs stats MNT\n\nPrints the counters of a mount (bytes served and source bytes read per rank).\n";

static int die_usage(const char *u, const char *msg)
{
	if (msg)
		fprintf(stderr, "tpfs: %s\n\n", msg);
	fputs(u, stderr);
	return 2;
}

static int parse_u32(const char *s, uint32_t *out)
{
	char *end;
	errno = 0;
	if (s[0] < '0' || s[0] > '9') /* strtoul would accept a sign and leading blanks */
		return -1;
	unsigned long v = strtoul(s, &end, 10);
	if (errno || *end || v > UINT32_MAX)
		return -1;
	*out = (uint32_t)v;
	return 0;
}

/* Parses an option that mount and plan share (--tp, --plan, --strict, --unmatched, --pad-vocab, --ep) into mo.
 * Returns 1 when c was one of them, 0 when it was not, or 2 (the exit status) after a usage
 * error. *have_t records --tp. */
static int model_option(int c, const char *arg, tp_model_opts *mo, int *have_t, const char *usage)
{
	uint32_t v;
	switch (c) {
	case 't':
		if (parse_u32(arg, &mo->T) < 0 || mo->T < 1 || mo->T > TP_MAX_T)
			return die_usage(usage, "--tp: give a number of ranks between 1 and 1024");
		*have_t = 1;
		return 1;
	case 'p':
		mo->plan = arg;
		return 1;
	case 's':
		mo->strict = 1;
		return 1;
	case 'U':
		if (strcmp(arg, "refuse") && strcmp(arg, "replicate"))
			return die_usage(usage, "--unmatched: give refuse or replicate");
		mo->unmatched_replicate = !strcmp(arg, "replicate");
		return 1;
	case 'E':
		mo->ep = 1;
		return 1;
	case 'V':
		mo->pad_vocab = 64;
		if (arg && (parse_u32(arg, &v) < 0 || v < 1))
			return die_usage(usage, "--pad-vocab=M: give a positive multiple");
		if (arg)
			mo->pad_vocab = v;
		return 1;
	default:
		return 0;
	}
}

/* ---- mountinfo ---- */

/* Undoes the octal escapes of /proc/self/mountinfo (\040 for a space). */
static void unescape(char *s)
{
	char *d = s;
	while (*s) {
		if (s[0] == '\\' && s[1] >= '0' && s[1] <= '7' && s[2] && s[3]) {
			*d++ = (char)((s[1] - '0') * 64 + (s[2] - '0') * 8 + (s[3] - '0'));
			s += 4;
		} else {
			*d++ = *s++;
		}
	}
	*d = 0;
}

/* Is path a mount point? If so, copies its filesystem type into fstype. */
static int is_mountpoint(const char *path, char *fstype, size_t n)
{
	FILE *f = fopen("/proc/self/mountinfo", "r");
	if (!f)
		return 0;
	char line[8192];
	int hit = 0;
	while (!hit && fgets(line, sizeof line, f)) {
		char *save, *tok = strtok_r(line, " ", &save);
		char *mp = NULL;
		for (int k = 0; tok && k < 4; k++)
			tok = strtok_r(NULL, " ", &save);
		mp = tok;
		if (!mp)
			continue;
		unescape(mp);
		if (strcmp(mp, path) != 0)
			continue;
		hit = 1;
		while ((tok = strtok_r(NULL, " ", &save)) && strcmp(tok, "-") != 0)
			;
		tok = strtok_r(NULL, " ", &save);
		snprintf(fstype, n, "%s", tok ? tok : "?");
	}
	fclose(f);
	return hit;
}

static int under(const char *inner, const char *outer)
{
	size_t l = strlen(outer);
	return strncmp(inner, outer, l) == 0 && (inner[l] == '/' || inner[l] == 0 || (l == 1 && outer[0] == '/'));
}

/* ---- mount ---- */

static int cmd_mount(int argc, char **argv)
{
	static const struct option lo[] = {
		{"tp", required_argument, 0, 't'}, {"plan", required_argument, 0, 'p'},
		{"strict", no_argument, 0, 's'},   {"pad-vocab", optional_argument, 0, 'V'},
		{"unmatched", required_argument, 0, 'U'},
		{"foreground", no_argument, 0, 'f'}, {"debug", no_argument, 0, 'd'},
		{"readahead", required_argument, 0, 'R'}, {"threads", required_argument, 0, 'j'},
		{"log", required_argument, 0, 'L'}, {"gather", required_argument, 0, 'g'},
		{"reply", required_argument, 0, 'y'}, {"max-background", required_argument, 0, 'b'},
		{"release-pages", required_argument, 0, 'P'}, {"cuda-min-runs", required_argument, 0, 'C'},
		{"cuda-min-bytes", required_argument, 0, 'B'}, {"config", required_argument, 0, 'c'},
		{"ep", no_argument, 0, 'E'},
		{"ranks", required_argument, 0, 'K'}, {"source-io", required_argument, 0, 'I'},
		{"help", no_argument, 0, 'h'},     {0, 0, 0, 0}};
	tp_model_opts mo = {.log = tp_log_model};
	const char *ranks = NULL;
	tp_fs_opts fo = {.readahead_kb = 4096, .threads = 16, .gather = TP_GATHER_AUTO, .release_pages = -1};
	int have_t = 0, c;
	char fuse_opts[4096] = "";
	uint32_t v;
	while ((c = getopt_long(argc, argv, "fdo:h", lo, NULL)) != -1) {
		int k = model_option(c, optarg, &mo, &have_t, usage_mount);
		if (k == 2)
			return 2;
		if (k == 1)
			continue;
		switch (c) {
		case 'f': fo.foreground = 1; break;
		case 'd': fo.debug = fo.foreground = 1; tp_log_debug = 1; break;
		case 'o': {
			size_t l = strlen(fuse_opts);
			snprintf(fuse_opts + l, sizeof fuse_opts - l, "%s%s", l ? "," : "", optarg);
			break;
		}
		case 'R':
			if (parse_u32(optarg, &fo.readahead_kb) < 0)
				return die_usage(usage_mount, "--readahead: give KiB (0 leaves the kernel's default)");
			break;
		case 'j':
			if (parse_u32(optarg, &fo.threads) < 0 || fo.threads < 1 || fo.threads > 1024)
				return die_usage(usage_mount, "--threads: give 1..1024");
			break;
		case 'L': fo.log_path = optarg; break;
		case 'c':
			if (strcmp(optarg, "local") && strcmp(optarg, "global"))
				return die_usage(usage_mount, "--config: local or global");
			mo.config_global = optarg[0] == 'g';
			break;
		case 'g':
			if (strcmp(optarg, "auto") && strcmp(optarg, "cpu") && strcmp(optarg, "cuda"))
				return die_usage(usage_mount, "--gather: auto, cpu or cuda");
			fo.gather = !strcmp(optarg, "cpu") ? TP_GATHER_CPU : !strcmp(optarg, "cuda") ? TP_GATHER_CUDA : TP_GATHER_AUTO;
			break;
		case 'y':
			if (strcmp(optarg, "auto") && strcmp(optarg, "iov") && strcmp(optarg, "copy"))
				return die_usage(usage_mount, "--reply: auto, iov or copy");
			fo.reply = optarg[0] == 'i' ? 1 : optarg[0] == 'c' ? 2 : 0;
			break;
		case 'b':
			if (parse_u32(optarg, &fo.max_background) < 0 || fo.max_background < 1 || fo.max_background > 65535)
				return die_usage(usage_mount, "--max-background: give 1..65535");
			break;
		case 'C':
			if (parse_u32(optarg, &fo.cuda_min_runs) < 0)
				return die_usage(usage_mount, "--cuda-min-runs: give a number of runs");
			break;
		case 'B':
			if (parse_u32(optarg, &v) < 0)
				return die_usage(usage_mount, "--cuda-min-bytes: give a number of bytes (below 4 GiB)");
			fo.cuda_min_bytes = v;
			break;
		case 'P':
			if (strcmp(optarg, "on") && strcmp(optarg, "off"))
				return die_usage(usage_mount, "--release-pages: on or off");
			fo.release_pages = optarg[1] == 'n';
			break;
		case 'K':
			if (ranks)
				return die_usage(usage_mount, "--ranks given twice: give one list, e.g. --ranks 0,1");
			ranks = optarg;
			break;
		case 'I':
			if (strcmp(optarg, "exact") && strcmp(optarg, "readahead") && strcmp(optarg, "random"))
				return die_usage(usage_mount, "--source-io: exact, readahead or random");
			fo.source_io = optarg[0] == 'e' ? 0 : optarg[0] == 'r' && optarg[1] == 'e' ? 1 : 2;
			break;
		case 'h': fputs(usage_mount, stdout); return 0;
		default: return die_usage(usage_mount, NULL);
		}
	}
	if (argc - optind != 2)
		return die_usage(usage_mount, "give SRC and MNT");
	if (!have_t)
		return die_usage(usage_mount, "--tp N is required");
	uint8_t serve[TP_MAX_T];
	if (ranks) {
		tp_err re;
		if (tp_ranks_parse(ranks, mo.T, serve, &fo.nserve, &re) < 0)
			return die_usage(usage_mount, re.msg);
		fo.serve = serve;
	}
	const char *src = argv[optind], *mnt = argv[optind + 1];
	char rsrc[PATH_MAX], rmnt[PATH_MAX], fstype[128];
	struct stat st;
	if (!realpath(src, rsrc) || stat(rsrc, &st) < 0) {
		fprintf(stderr, "tpfs: %s: %s\n", src, strerror(errno));
		return 1;
	}
	if (!S_ISDIR(st.st_mode)) {
		fprintf(stderr, "tpfs: %s: not a folder (give the folder that holds config.json and the .safetensors files)\n", src);
		return 1;
	}
	if (!realpath(mnt, rmnt) || stat(rmnt, &st) < 0) {
		fprintf(stderr, "tpfs: %s: %s (create the mount point first: mkdir -p %s)\n", mnt, strerror(errno), mnt);
		return 1;
	}
	if (!S_ISDIR(st.st_mode)) {
		fprintf(stderr, "tpfs: %s: not a folder\n", mnt);
		return 1;
	}
	if (is_mountpoint(rmnt, fstype, sizeof fstype)) {
		fprintf(stderr, "tpfs: %s: already a mount point (%s); unmount it first\n", mnt, fstype);
		return 1;
	}
	if (under(rmnt, rsrc)) {
		fprintf(stderr, "tpfs: %s is inside %s: the mount would contain itself; mount elsewhere\n", mnt, src);
		return 1;
	}
	if (under(rsrc, rmnt)) {
		fprintf(stderr, "tpfs: %s is inside %s: the mount would hide its own source; mount elsewhere\n", src, mnt);
		return 1;
	}
	mo.src = rsrc;
	mo.mnt = rmnt;
	fo.mnt = rmnt;
	fo.fuse_opts = fuse_opts[0] ? fuse_opts : NULL;
	if (fo.gather == TP_GATHER_CUDA) {
		char why[512];
		if (tp_cuda_available(why, sizeof why) < 0) {
			fprintf(stderr, "tpfs: --gather cuda: %s; use --gather auto or cpu\n", why);
			return 1;
		}
	}
	tp_model m;
	tp_err e;
	tp_err_clear(&e);
	int orc = tp_model_open(&m, &mo, &e);
	tp_log_repeats();
	if (orc < 0) {
		fprintf(stderr, "tpfs: %s\n", e.msg);
		return 1;
	}
	if (tp_fs_nofile(m.ntensor_files + 64, &e) < 0) {
		fprintf(stderr, "tpfs: %s\n", e.msg);
		tp_model_close(&m);
		return 1;
	}
	int parent = 0;
	int rc = tp_fs_main(&m, &fo, &parent, &e);
	if (rc < 0 && (parent || fo.foreground))
		fprintf(stderr, "tpfs: %s\n", e.msg);
	tp_model_close(&m);
	return rc < 0 ? 1 : 0;
}

/* ---- umount ---- */

static int cmd_umount(int argc, char **argv)
{
	static const struct option lo[] = {{"lazy", no_argument, 0, 'l'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
	int lazy = 0, c;
	while ((c = getopt_long(argc, argv, "lh", lo, NULL)) != -1) {
		if (c == 'l')
			lazy = 1;
		else if (c == 'h') {
			fputs(usage_umount, stdout);
			return 0;
		} else
			return die_usage(usage_umount, NULL);
	}
	if (argc - optind != 1)
		return die_usage(usage_umount, "give MNT");
	char rmnt[PATH_MAX], fstype[128];
	if (!realpath(argv[optind], rmnt)) {
		fprintf(stderr, "tpfs: %s: %s\n", argv[optind], strerror(errno));
		return 1;
	}
	if (!is_mountpoint(rmnt, fstype, sizeof fstype)) {
		fprintf(stderr, "tpfs: %s: not a mount point\n", argv[optind]);
		return 1;
	}
	if (strcmp(fstype, "fuse.tpfs") != 0) {
		fprintf(stderr, "tpfs: %s: a %s mount, not tpfs; not touching it\n", argv[optind], fstype);
		return 1;
	}
	if (geteuid() == 0) {
		if (umount2(rmnt, lazy ? MNT_DETACH : 0) == 0)
			return 0;
		fprintf(stderr, "tpfs: umount %s: %s%s\n", argv[optind], strerror(errno),
			errno == EBUSY ? " (files are open; close them or use --lazy)" : "");
		return 1;
	}
	pid_t pid = fork();
	if (pid == 0) {
		execlp("fusermount3", "fusermount3", lazy ? "-uz" : "-u", rmnt, (char *)NULL);
		fprintf(stderr, "tpfs: cannot run fusermount3: %s\n", strerror(errno));
		_exit(127);
	}
	int status = 0;
	if (pid < 0 || waitpid(pid, &status, 0) < 0)
		return 1;
	return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}

/* ---- check ---- */

static void quiet_log(void *ctx, int level, const char *msg)
{
	(void)ctx;
	if (level == 0 && tp_log_shown(msg))
		fprintf(stderr, "tpfs: warning: %s\n", msg);
}

static int cmd_check(int argc, char **argv)
{
	static const struct option lo[] = {{"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
	int c;
	while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
		if (c == 'h') {
			fputs(usage_check, stdout);
			return 0;
		}
		return die_usage(usage_check, NULL);
	}
	if (argc - optind != 1)
		return die_usage(usage_check, "give SRC");
	tp_model_opts mo = {.src = argv[optind], .T = 1, .check_only = 1, .log = quiet_log};
	tp_model m;
	tp_err e;
	int orc = tp_model_open(&m, &mo, &e);
	tp_log_repeats();
	if (orc < 0) {
		fprintf(stderr, "tpfs: %s\n", e.msg);
		return 1;
	}
	int bad = 0, files = 0;
	uint64_t tensors = 0, bytes = 0;
	for (uint32_t i = 0; i < m.nn; i++) {
		const tp_node *n = &m.n[i];
		if (n->kind == TN_TENSORS) {
			files++;
			tensors += n->h.n;
			bytes += n->h.data_len;
			unsigned seen[ST_NDTYPES] = {0};
			for (size_t k = 0; k < n->h.n; k++)
				seen[n->h.t[k].dtype]++;
			char dts[256] = "";
			for (int d = 0; d < ST_NDTYPES; d++) {
				size_t l = strlen(dts);
				if (seen[d])
					snprintf(dts + l, sizeof dts - l, "%s%s x%u", l ? ", " : "", st_dtype_name((st_dtype)d), seen[d]);
			}
			printf("ok   %s: %zu tensors, %llu bytes of data, header %llu bytes (%s)\n", n->path, n->h.n,
			       (unsigned long long)n->h.data_len, (unsigned long long)n->h.json_len, dts);
		} else if (n->error) {
			files++;
			bad++;
			printf("BAD  %s\n", n->error);
		}
	}
	printf("%d safetensors file%s, %d invalid; %llu tensors, %llu bytes of data\n", files, files == 1 ? "" : "s", bad,
	       (unsigned long long)tensors, (unsigned long long)bytes);
	tp_model_close(&m);
	return bad ? 1 : 0;
}

/* ---- plan ---- */

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
		pc->cap = m->nn;
		pc->rows = calloc(pc->cap, sizeof *pc->rows);
	}
	if (!pc->rows)
		return;
	if (!pc->rows[node])
		pc->rows[node] = calloc(m->n[node].h.n, sizeof **pc->rows);
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
	for (uint32_t i = m->nn; i-- > 0;) {
		const tp_node *n = &m->n[i];
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
		for (uint32_t i = 0; i < m->nn; i++)
			if (m->n[i].kind == TN_TENSORS && m->n[i].lay) {
				nt += m->n[i].lay[r].nexpert;
				by += m->n[i].lay[r].expert_bytes;
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

/* tpfs plan --io: per rank and for the selected set, rank-file bytes, source run bytes and the
 * page-touch minimum (pages of this machine's page size). */
static int print_io(const tp_model *m, const uint8_t *sel, uint32_t nsel, const char *ranks, tp_err *e)
{
	uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE), src = 0;
	uint8_t one[TP_MAX_T] = {0};
	char a[32], b[32], c[32];
	for (uint32_t i = 0; i < m->nn; i++)
		src += m->n[i].kind == TN_TENSORS ? m->n[i].src_size : 0;
	printf("source: %s\nplan:   %s\nranks:  %u\npage:   %llu bytes\n\n", m->src, m->plan_origin, m->T,
	       (unsigned long long)page);
	printf("%-8s %16s %16s %16s %10s\n", "rank", "rank_files", "source_runs", "page_touch_min", "x_files");
	tp_io_need set = {0, 0};
	uint64_t set_files = 0;
	for (uint32_t r = 0; r <= m->T; r++) {
		int total = r == m->T;
		if (!total && !sel[r])
			continue;
		if (!total)
			one[r] = 1;
		tp_io_need sum = {0, 0};
		uint64_t files = 0;
		for (uint32_t i = 0; i < m->nn; i++) {
			if (m->n[i].kind != TN_TENSORS)
				continue;
			tp_io_need need;
			if (tp_io_need_of(m->n[i].lay, m->T, total ? sel : one, page, &need, e) < 0)
				return -1;
			sum.bytes += need.bytes;
			sum.pages += need.pages;
			for (uint32_t q = 0; q < m->T; q++)
				files += (total ? sel[q] : q == r) ? m->n[i].lay[q].size : 0;
		}
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
	printf("\nserved set: %s (%u of %u ranks): rank files %s, page-touch minimum %s of a %s source (%.2fx)\n",
	       ranks ? ranks : "all", nsel, m->T, human(set_files, a, sizeof a), human(set.pages * page, b, sizeof b),
	       human(src, c, sizeof c), src ? (double)(set.pages * page) / (double)src : 0.0);
	return 0;
}

static int cmd_plan(int argc, char **argv)
{
	static const struct option lo[] = {
		{"tp", required_argument, 0, 't'}, {"rank", required_argument, 0, 'r'}, {"json", no_argument, 0, 'j'},
		{"plan", required_argument, 0, 'p'}, {"strict", no_argument, 0, 's'},
		{"unmatched", required_argument, 0, 'U'},
		{"pad-vocab", optional_argument, 0, 'V'}, {"list", no_argument, 0, 'l'}, {"help", no_argument, 0, 'h'},
		{"io", no_argument, 0, 'i'}, {"ranks", required_argument, 0, 'K'}, {"ep", no_argument, 0, 'E'},
		{0, 0, 0, 0}};
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
	if (rank >= mo.T)
		return die_usage(usage_plan, "--rank must be below --tp");
	uint8_t sel[TP_MAX_T];
	uint32_t nsel = mo.T;
	memset(sel, 1, sizeof sel);
	if (ranks) {
		tp_err re;
		if (!io)
			return die_usage(usage_plan, "--ranks goes with --io");
		if (tp_ranks_parse(ranks, mo.T, sel, &nsel, &re) < 0)
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
	if (io) {
		if (print_io(&m, sel, nsel, ranks, &e) < 0) {
			fprintf(stderr, "tpfs: %s\n", e.msg);
			rc = -1;
		}
	} else if (json) {
		print_json_plan(&m, &pc);
	} else {
		printf("source: %s\nplan:   %s\nranks:  %u (showing rank %u)\n\n", m.src, m.plan_origin, m.T, rank);
		printf("%-56s %-10s %-44s %-22s %-22s %12s\n", "tensor", "rule", "split", "full shape", "local shape", "local bytes");
		for (uint32_t i = 0; i < m.nn; i++) {
			const tp_node *n = &m.n[i];
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
			for (uint32_t i = 0; i < m.nn; i++) {
				if (m.n[i].kind != TN_TENSORS)
					continue;
				loc += m.n[i].lay[r].data_size;
				rep += m.n[i].lay[r].repl_bytes;
				spl += m.n[i].lay[r].split_bytes;
				fsz += m.n[i].lay[r].size;
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
		for (uint32_t i = 0; i < m.nn && shown < 50; i++)
			for (size_t k = 0; pc.rows && pc.rows[i] && k < m.n[i].h.n && shown < 50; k++)
				if (pc.rows[i][k].rule == -1) {
					printf("  %s (%s)\n", m.n[i].h.t[k].name, m.n[i].path);
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

/* ---- stats ---- */

static int cmd_stats(int argc, char **argv)
{
	if (argc == 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
		fputs(usage_stats, stdout);
		return 0;
	}
	if (argc != 2)
		return die_usage(usage_stats, "give MNT");
	char path[PATH_MAX];
	snprintf(path, sizeof path, "%s/.tpfs-stats", argv[1]);
	FILE *f = fopen(path, "r");
	if (!f) {
		fprintf(stderr, "tpfs: %s: %s (is %s a tpfs mount?)\n", path, strerror(errno), argv[1]);
		return 1;
	}
	char buf[4096];
	size_t n;
	while ((n = fread(buf, 1, sizeof buf, f)) > 0)
		fwrite(buf, 1, n, stdout);
	fclose(f);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc < 2)
		return die_usage(usage_main, NULL);
	const char *cmd = argv[1];
	if (!strcmp(cmd, "--version") || !strcmp(cmd, "-V") || !strcmp(cmd, "version")) {
		printf("tpfs %s\n", TPFS_VERSION);
		return 0;
	}
	if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
		const char *u = usage_main;
		if (argc > 2)
			u = !strcmp(argv[2], "mount") ? usage_mount : !strcmp(argv[2], "plan") ? usage_plan
			    : !strcmp(argv[2], "check") ? usage_check : !strcmp(argv[2], "umount") ? usage_umount
			    : !strcmp(argv[2], "stats") ? usage_stats : usage_main;
		fputs(u, stdout);
		return 0;
	}
	argc--;
	argv++;
	tp_err le;
	tp_fs_nofile(0, &le); /* every safetensors file is held open: the soft limit is raised to the hard one */
	if (!strcmp(cmd, "mount"))
		return cmd_mount(argc, argv);
	if (!strcmp(cmd, "umount") || !strcmp(cmd, "unmount"))
		return cmd_umount(argc, argv);
	if (!strcmp(cmd, "check"))
		return cmd_check(argc, argv);
	if (!strcmp(cmd, "plan"))
		return cmd_plan(argc, argv);
	if (!strcmp(cmd, "stats"))
		return cmd_stats(argc, argv);
	char msg[256];
	snprintf(msg, sizeof msg, "unknown command '%s'", cmd);
	return die_usage(usage_main, msg);
}
