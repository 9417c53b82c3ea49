/* cli_help.c: the help texts of the tpfs command line, one per command (declared in cli.h):
 * what `tpfs COMMAND --help` prints, and what a usage error prints after its message. Every
 * option a command parses (cli.c, cli_plan.c) is described here; and the argument helpers both
 * use (die_usage, parse_u32, the options mount and plan share), below the texts. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

const char *const usage_main =
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
	"  SRC MNT -o tp=N,...    mount, as mount(8) runs it: an fstab line 'SRC MNT fuse.tpfs\n"
	"                         tp=8,view=vllm,ranks=0-7 0 0', mount -t fuse.tpfs, a systemd mount unit\n"
	"\n"
	"'tpfs COMMAND --help' describes each command. 'tpfs --version' prints the version.\n";

const char *const usage_mount =
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
	"  --view hf|vllm|sglang|FILE\n"
	"                      how the ranks are presented. hf (default): the rank folders above.\n"
	"                      vllm: vLLM's own per-rank files at MNT, model-rank-{r}-part-{p}.safetensors\n"
	"                      in vLLM's state-dict names (fused qkv_proj and gate_up_proj, stacked\n"
	"                      experts, the attention's scale scalars), next to SRC's other files\n"
	"                      unchanged (config.json as in SRC): 'vllm serve MNT --load-format\n"
	"                      sharded_state -tp N' loads its ranks with no slicing. Quantized forms\n"
	"                      served where a view proves them: FP8 128x128 blocks, compressed-tensors\n"
	"                      W8A8, ModelOpt NVFP4, gpt-oss MXFP4 (views/vllm/README.md). A family\n"
	"                      without a vLLM view, or a form without one, is refused by name.\n"
	"                      sglang: SGLang's per-rank files, the same names without vLLM's scale\n"
	"                      scalars, for 'python -m sglang.launch_server --model-path MNT\n"
	"                      --load-format sharded_state --tp N' (llama, mistral, qwen2, qwen3,\n"
	"                      granite, glm4, apertus, arcee, olmo, hunyuan_v1_dense, cohere, phi3,\n"
	"                      gemma3, qwen2_moe, qwen3_moe, mixtral, glm4_moe, deepseek_v3,\n"
	"                      kimi_k2; unquantized; no --pp; qwen3_next refused: SGLang's sharded_state\n"
	"                      leaves its norms' gemma_weight at 1.0). FILE: a view file\n"
	"                      (docs/PLANS.md); 'tpfs plan SRC --tp N --view vllm' shows every key\n"
	"  --ranks LIST        serve only these rank folders of the N-way split, e.g. 8-15 or 0,3 (one\n"
	"                      node of a multi-node job; the source is read only for these ranks);\n"
	"                      the folders keep their global numbers (8-15 gives rank8 .. rank15).\n"
	"                      Under --view with --pp, ranks are vLLM's: stage x N + TP rank\n"
	"  --pp P              pipeline stages, under --view vllm only: P x N ranks, stage s's TP rank\n"
	"                      t served as model-pp-{s}-tp-{t}-part-{p}.safetensors holding exactly\n"
	"                      the tensors of its layers (the first stage also the embedding, the last\n"
	"                      the final norm and lm_head), for 'vllm serve MNT --load-format\n"
	"                      sharded_state -tp N -pp P'. Layers are divided as vLLM divides them\n"
	"                      (the remainder to the stages before the last); a family whose stages\n"
	"                      are not proven is refused by name\n"
	"  --pp-layers LIST    layers per stage, e.g. 2,3,2: what VLLM_PP_LAYER_PARTITION says to vLLM\n"
	"                      (give both the same list)\n"
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
	"  --ep[=PLACEMENT]    expert parallelism: the routed experts (the plan's \"experts\") are not\n"
	"                      cut; rank r holds experts [r*E/N, (r+1)*E/N) whole (every tensor of\n"
	"                      them: weights, biases, scales) and no other; names keep their global\n"
	"                      index. Everything else is split as without --ep. N must divide E.\n"
	"                      Under --view vllm (vLLM's --enable-expert-parallel) for the MoE families\n"
	"                      whose placement is proven; --ep=round_robin (experts r, r+N, ...: vLLM's\n"
	"                      --expert-placement-strategy round_robin) where vLLM uses it, in models\n"
	"                      with several expert groups (DeepSeek-V3, GLM-4.5 with n_group > 1)\n"
	"  --dp D              data parallelism with expert parallelism (vLLM's --data-parallel-size D\n"
	"                      --enable-expert-parallel), with --ep under --view vllm: D x N ranks, DP\n"
	"                      rank d's TP rank t served as model-dp-{d}-rank-{t}-part-{p}.safetensors\n"
	"                      holding TP rank t's dense tensors and the experts of EP rank d x N + t\n"
	"                      of D x N (the first E mod (D x N) ranks one more, as vLLM places them;\n"
	"                      sharded_state reads them with the pattern\n"
	"                      model-dp-{d}-rank-{rank}-part-{part}.safetensors). --ranks counts\n"
	"                      d x N + t; the families whose DP x EP is proven only\n"
	"  -f, --foreground    stay in the foreground (log to stderr)\n"
	"  -d, --debug         libfuse debug output; counters at unmount (implies -f)\n"
	"  -o OPTIONS          mount options, comma separated: every option above and below as\n"
	"                      key=value or key (tp=8,view=vllm,ranks=0-7,ep,pad-vocab=64; _ and -\n"
	"                      alike; a list takes : for its commas: ranks=0:3, pp-layers=2:3:2), as\n"
	"                      an fstab line or 'mount -t fuse.tpfs SRC MNT -o ...' gives them\n"
	"                      (mount.fuse3 runs 'tpfs SRC MNT -o ...'); FUSE's allow_other,\n"
	"                      allow_root, auto_unmount, fsname=, max_read=, exec, noexec, atime,\n"
	"                      noatime, nodiratime, sync, async, dirsync and the SELinux context=\n"
	"                      options; ro, rw, dev, nodev, suid, nosuid, defaults, auto, noauto,\n"
	"                      nofail, user, users, nouser, owner, group, _netdev, x-* and comment=*\n"
	"                      are dropped. Any other is refused by name. The mount is always ro,\n"
	"                      nodev, nosuid and default_permissions: each file keeps the owner,\n"
	"                      group and read/execute bits of its source; other users reach the\n"
	"                      mount only with -o allow_other (as a non-root user, that needs\n"
	"                      user_allow_other in /etc/fuse.conf). mount.fuse3's setuid=USER runs\n"
	"                      tpfs as USER; its drop_privileges is refused (tpfs makes its own mount)\n"
	"  --readahead KB      readahead window set on the mount (default 4096: reads arrive as\n"
	"                      1 MiB requests, several in flight; 0 leaves the kernel's 128)\n"
	"  --threads N         worker threads (default 16)\n"
	"  --log FILE          log file in background mode (default: syslog, tag tpfs); the mount\n"
	"                      says where; 'tpfs stats MNT' lists the files whose reads failed\n"
	"  --gather MODE       auto, cpu or cuda. cuda gathers every strided read on the GPU and is\n"
	"                      refused when no device is usable; auto (default) uses it only for\n"
	"                      gathers past --cuda-min-runs N and --cuda-min-bytes B, which are unset\n"
	"                      (so: the CPU) until measurements on a GPU machine give them values\n"
	"tuning (docs/PERFORMANCE.md has the measurements behind the defaults):\n"
	"  --reply MODE        auto or copy (default: source bytes are copied into a buffer, then the\n"
	"                      source is checked again before the reply), or iov (replies point into\n"
	"                      the source mapping: the kernel copies after the check, so a read that\n"
	"                      overlaps a write of the source may return a mix of old and new bytes)\n"
	"  --push SIZE|auto|off  fill the page cache of the served files ahead of the loader, in the\n"
	"                      order loaders read, up to SIZE bytes (suffix K, M, G, T; auto: a quarter\n"
	"                      of MemAvailable at mount, or of the memory cgroup's limit where that is\n"
	"                      lower); reads always go first. Default auto; .tpfs-stats says how far\n"
	"                      it got (running, done, stopped at the budget)\n"
	"  --push-io MODE      how the push reads source pages not in the page cache: direct (O_DIRECT\n"
	"                      reads of exactly their pages into the push's buffer: less CPU, no source\n"
	"                      page cache made, so ranks served side by side each read shared pages),\n"
	"                      map (prefetched into the page cache, then copied from the mapping, as\n"
	"                      reads are), or auto (default: direct where one rank is served, else\n"
	"                      map). Where O_DIRECT is refused, map\n"
	"  --passthrough on|off  serve each pushed file from a private copy in a huge-page tmpfs that the\n"
	"                      kernel reads directly (FUSE passthrough: kernel 6.9+, CAP_SYS_ADMIN):\n"
	"                      a loader's reads then cost what a local file's do, about half those of\n"
	"                      FUSE's page cache. A copy is made only where the whole file fits the\n"
	"                      push budget, and goes at a source change (open files then read\n"
	"                      end-of-file, never other bytes). Default off (the vLLM and SGLang\n"
	"                      plugins ask for on); .tpfs-stats says why it is not used where it cannot be\n"
	"  --passthrough-keep SECONDS  how long a copy stays after its loader closed it, so that the next\n"
	"                      start reads it too (default 600). Copies are memory the kernel cannot\n"
	"                      reclaim: once that time has passed, or at least 10 s after the close when\n"
	"                      memory runs short (MemAvailable, or the memory cgroup's room, below an\n"
	"                      eighth of its whole), a copy moves into the page cache (reclaimable), read\n"
	"                      from the copy, not from the source again\n"
	"  --nice N|keep       nice value of the threads that answer FUSE requests (default -10,\n"
	"                      where the daemon may raise its priority: CAP_SYS_NICE, as root). A\n"
	"                      page fault on the mount waits for one of them; while an engine's\n"
	"                      workers keep every core busy, at their priority each wait takes a\n"
	"                      time slice. The push and the other background threads keep the\n"
	"                      inherited value; keep leaves the request threads at it too\n"
	"  --max-background N  FUSE requests in flight for readahead (default 64; the kernel's is 12)\n"
	"  --release-pages on|off  drop the daemon's mapping of source pages after each reply so its\n"
	"                      RSS stays flat (default on; the pages stay in the page cache)\n"
	"  --source-io MODE    exact (default: no readahead on the source, the next runs' pages\n"
	"                      prefetched), readahead (the kernel's) or random (neither; for measuring).\n"
	"                      Pick readahead on stores limited by request count rather than bytes:\n"
	"                      more bytes are read, in fewer and larger requests\n"
	"\n"
	"Unmount with 'tpfs umount MNT', 'fusermount3 -u MNT', or SIGTERM/SIGINT to the daemon.\n";

const char *const usage_plan =
	"usage: tpfs plan SRC --tp N [--rank R] [--json] [--plan NAME|FILE] [--strict] [--unmatched refuse|replicate]\n"
	"                 [--pad-vocab[=M]] [--ep[=linear|round_robin]] [--view hf|vllm|sglang|FILE] [--pp P [--pp-layers LIST]]\n"
	"                 [--dp D]\n"
	"       tpfs plan SRC --tp N [--view vllm --pp P|--dp D] --io [--ranks LIST]\n"
	"       tpfs plan --list\n"
	"\n"
	"Prints, for rank R (default 0), every tensor: the rule that matched, how it is split, its\n"
	"full and local shapes and its local bytes; then per-rank totals (local, replicated, split)\n"
	"and the tensors no rule matched (refused, each named with its shape, unless --unmatched\n"
	"replicate serves them whole). Nothing is mounted. With --view vllm: each part file of rank R\n"
	"as the engine reads it, every served tensor with its local shape and the source tensors it is\n"
	"made of (concatenated, stacked, or a constant); with --pp, each stage's layers, and R is a\n"
	"rank of all P x N (stage x N + TP rank).\n"
	"--ep (expert parallelism, as for mount) also prints which routed experts each rank holds.\n"
	"--plan is as for mount: a model_type no built-in plan knows is refused; --plan generic opts\n"
	"in to a guess by tensor name that refuses what a name cannot tell.\n"
	"--json prints the resolved plan as a plan file (one exact rule per tensor) that --plan\n"
	"accepts back, for editing. --list prints the built-in plans.\n"
	"--io prints what each rank must read from the source: its rank files' bytes, the source bytes\n"
	"its runs cover, and the page-touch minimum (the source pages holding any of them: what a\n"
	"reader fetching whole pages reads at least), per rank and for the set --ranks names (all by\n"
	"default; pages shared by ranks counted once).\n";

const char *const usage_check =
	"usage: tpfs check SRC\n"
	"\n"
	"Validates every .safetensors file under SRC against every rule of the format (header size\n"
	"and JSON, dtypes, shapes, offsets that tile the data exactly, file length) and prints one line\n"
	"per file. Exits 1 if any file is invalid.\n";

const char *const usage_umount =
	"usage: tpfs umount [--lazy] MNT\n"
	"\n"
	"Unmounts a tpfs mount (the daemon then exits). A mount still busy after 2 s (files open) is refused;\n"
	"--lazy detaches it even while files are open.\n";

const char *const usage_stats =
	"usage: tpfs stats MNT\n\nPrints the counters of a mount: bytes served and source bytes read per rank, the\n"
	"source bytes storage delivered, where the daemon logs, and the files whose reads failed\n"
	"(the latest 16, each with its reason and time: a loader that maps a file sees a failed\n"
	"read as a bus error, SIGBUS).\n";

/* ---- argument helpers (cli.h) ---- */

int die_usage(const char *u, const char *msg)
{
	if (msg)
		fprintf(stderr, "tpfs: %s\n\n", msg);
	fputs(u, stderr);
	return 2;
}

int parse_u32(const char *s, uint32_t *out)
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

static uint32_t pp_given; /* --pp-layers: how many stages it gave */

int model_options_check(const tp_model_opts *mo, const char *usage)
{
	if (mo->pp > 1 && !mo->view)
		return die_usage(usage, "--pp: pipeline stages are served under an engine view only (--view vllm: vLLM's "
			"model-pp-{s}-tp-{t} files); rank folders are per TP rank");
	if (mo->pp_layers && pp_given != (mo->pp ? mo->pp : 1))
		return die_usage(usage, "--pp-layers: give one layer count per stage (--pp of them)");
	if (mo->pp > 1 && mo->ep)
		return die_usage(usage, "--pp with --ep: not served together");
	if (mo->dp > 1 && (!mo->ep || !mo->view))
		return die_usage(usage, "--dp: data-parallel ranks are served with expert parallelism (--ep) under an "
			"engine view (--view vllm) only: without --ep every DP rank reads TP rank t's files");
	if (mo->ep == 2 && !mo->view)
		return die_usage(usage, "--ep=round_robin: under an engine view only (--view vllm); rank folders place "
			"experts linearly (--ep)");
	return 0;
}

int model_option(int c, const char *arg, tp_model_opts *mo, int *have_t, const char *usage)
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
	case 'E': /* --ep or --ep=linear, --ep=round_robin (vLLM's expert_placement_strategy) */
		if (arg && strcmp(arg, "linear") && strcmp(arg, "round_robin"))
			return die_usage(usage, "--ep=PLACEMENT: linear (the default) or round_robin");
		mo->ep = arg && !strcmp(arg, "round_robin") ? 2 : 1;
		return 1;
	case 'W': /* --view hf (the rank folders), an engine, or a view file */
		mo->view = !strcmp(arg, "hf") ? NULL : arg;
		return 1;
	case 'A':
		if (parse_u32(arg, &mo->dp) < 0 || mo->dp < 1 || mo->dp > TP_MAX_T)
			return die_usage(usage, "--dp: give a number of data-parallel ranks between 1 and 1024");
		return 1;
	case 'Q':
		if (parse_u32(arg, &mo->pp) < 0 || mo->pp < 1 || mo->pp > TP_PP_MAX)
			return die_usage(usage, "--pp: give a number of pipeline stages between 1 and 64");
		return 1;
	case 'G': { /* --pp-layers 2,3,2: layers per stage (vLLM's VLLM_PP_LAYER_PARTITION) */
		static uint32_t given[TP_PP_MAX];
		char buf[1024], *save = NULL, *tok;
		pp_given = 0;
		snprintf(buf, sizeof buf, "%s", arg);
		for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
			if (pp_given == TP_PP_MAX || parse_u32(tok, &given[pp_given]) < 0 || given[pp_given] < 1)
				return die_usage(usage, "--pp-layers: give the layers of each stage, e.g. 2,3,2 (as "
					"VLLM_PP_LAYER_PARTITION), each at least 1");
			pp_given++;
		}
		mo->pp_layers = given;
		return 1;
	}
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
