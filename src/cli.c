/* cli.c: the tpfs command line (the thin shell's upper half): argv, help, exit codes. This file
 * holds main and every command but plan (cli_plan.c); the help texts and the argument helpers
 * (cli.h) are cli_help.c's.
 *
 *   tpfs mount SRC MNT --tp N [...]   serve SRC as N rank folders under MNT
 *   tpfs umount MNT                   unmount
 *   tpfs plan SRC --tp N [...]        the dry run: every tensor, its rule, full -> local shape
 *   tpfs check SRC                    strict validation of every safetensors file
 *   tpfs stats MNT                    the counters of a mount
 *   tpfs SRC MNT -o tp=N,...          mount, as mount(8) runs it through mount.fuse3 (fstab, a systemd unit)
 *
 * Exit status: 0 success, 1 the input or the plan was refused (the message says why), 2 usage.
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "fs.h"
#include "gather_module.h"
#include "io_plan.h"
#include "model.h"
#include "slurp.h"

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

/* --push: "off" (0), "auto" (-1: the daemon takes a quarter of MemAvailable, or of its memory cgroup's
 * limit where lower) or a size: digits and an optional binary suffix K, M, G or T. 0, or -1 for
 * anything else (a size of 2^62 or more). */
static int parse_push(const char *s, long long *out)
{
	if (!strcmp(s, "off") || !strcmp(s, "auto")) {
		*out = s[0] == 'o' ? 0 : -1;
		return 0;
	}
	if (s[0] < '0' || s[0] > '9')
		return -1;
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	int shift = !*end ? 0 : !strcmp(end, "K") ? 10 : !strcmp(end, "M") ? 20 : !strcmp(end, "G") ? 30 : !strcmp(end, "T") ? 40 : -1;
	if (errno || shift < 0 || v >= (1ull << (62 - shift)))
		return -1;
	*out = (long long)(v << shift);
	return 0;
}

#define LOCK_WAIT_S 600 /* how long a mount waits for another's lock on MNT (its planning included) */

/* What the options of one mount have said so far (cmd_mount, from argv and from -o key=value). */
struct mount_args {
	tp_model_opts mo;
	tp_fs_opts fo;
	const char *ranks;    /* --ranks LIST, or NULL */
	int have_t;           /* --tp given */
	char fuse_opts[4096]; /* the FUSE options of -o, comma separated */
	char vals[8192];      /* the values of -o key=value items, NUL-terminated each, which the above point into */
	size_t nvals;         /* bytes of vals used */
};

static const struct option mount_lo[] = {
	{"tp", required_argument, 0, 't'}, {"plan", required_argument, 0, 'p'},
	{"strict", no_argument, 0, 's'},   {"pad-vocab", optional_argument, 0, 'V'},
	{"unmatched", required_argument, 0, 'U'},
	{"foreground", no_argument, 0, 'f'}, {"debug", no_argument, 0, 'd'},
	{"readahead", required_argument, 0, 'R'}, {"threads", required_argument, 0, 'j'},
	{"log", required_argument, 0, 'L'}, {"gather", required_argument, 0, 'g'},
	{"reply", required_argument, 0, 'y'}, {"max-background", required_argument, 0, 'b'},
	{"release-pages", required_argument, 0, 'P'}, {"cuda-min-runs", required_argument, 0, 'C'},
	{"cuda-min-bytes", required_argument, 0, 'B'}, {"config", required_argument, 0, 'c'},
	{"ep", optional_argument, 0, 'E'}, {"view", required_argument, 0, 'W'},
	{"ranks", required_argument, 0, 'K'}, {"source-io", required_argument, 0, 'I'},
	{"pp", required_argument, 0, 'Q'}, {"pp-layers", required_argument, 0, 'G'},
	{"dp", required_argument, 0, 'A'},
	{"push", required_argument, 0, 'H'}, {"nice", required_argument, 0, 'N'},
	{"push-io", required_argument, 0, 'J'}, {"passthrough", required_argument, 0, 'X'},
	{"passthrough-keep", required_argument, 0, 'Z'}, {"help", no_argument, 0, 'h'},     {0, 0, 0, 0}};

/* Options of -o that tpfs takes as given and drops: fstab's and mount(8)'s own (mount.fuse3 drops the same
 * ones, and mount(8) most: x-*, comment=, _netdev), ro and rw (the mount is read-only either way), and
 * mount.fuse3's dev and suid (the mount is nodev,nosuid, libfuse's default for root, whatever they say). */
static const char *const o_dropped[] = {"defaults", "auto", "noauto", "nofail", "user", "users", "nouser", "owner",
	"group", "_netdev", "ro", "rw", "dev", "nodev", "suid", "nosuid", NULL};
static const char *const o_dropped_prefix[] = {"x-", "comment=", NULL};
/* Options of -o passed to libfuse (and the kernel) as they are; with =, a key taking a value. */
static const char *const o_fuse[] = {"allow_other", "allow_root", "auto_unmount", "default_permissions", "exec",
	"noexec", "atime", "noatime", "nodiratime", "sync", "async", "dirsync", "fsname=", "subtype=", "max_read=",
	"context=", "fscontext=", "defcontext=", "rootcontext=", NULL};

static int mount_option(int c, const char *arg, struct mount_args *a);

/* Appends the FUSE option s (n bytes) to a->fuse_opts. */
static void fuse_opt_add(struct mount_args *a, const char *s, size_t n)
{
	size_t l = strlen(a->fuse_opts);
	snprintf(a->fuse_opts + l, sizeof a->fuse_opts - l, "%s%.*s", l ? "," : "", (int)n, s);
}

/* One item of -o (n bytes at s, no comma): a tpfs option as key=value (the long option's name, - or _ alike;
 * lists in ranks and pp-layers with : for the comma, which separates the items), a FUSE option (o_fuse),
 * or one that is dropped (o_dropped). Returns 0, or 2 after naming what is wrong. */
static int mount_o_item(const char *s, size_t n, struct mount_args *a)
{
	const char *eq = memchr(s, '=', n);
	size_t kl = eq ? (size_t)(eq - s) : n;
	char key[64];
	if (!n)
		return 0;
	for (int i = 0; o_dropped[i]; i++)
		if (strlen(o_dropped[i]) == n && !memcmp(s, o_dropped[i], n))
			return 0;
	for (int i = 0; o_dropped_prefix[i]; i++)
		if (n >= strlen(o_dropped_prefix[i]) && !memcmp(s, o_dropped_prefix[i], strlen(o_dropped_prefix[i])))
			return 0;
	for (int i = 0; o_fuse[i]; i++) {
		size_t l = strlen(o_fuse[i]);
		if (o_fuse[i][l - 1] == '=' ? (n > l && !memcmp(s, o_fuse[i], l)) : (n == l && !memcmp(s, o_fuse[i], l))) {
			fuse_opt_add(a, s, n);
			return 0;
		}
	}
	if (kl < sizeof key) {
		for (size_t i = 0; i < kl; i++)
			key[i] = s[i] == '_' ? '-' : s[i];
		key[kl] = 0;
		for (const struct option *o = mount_lo; o->name; o++) {
			if (strcmp(o->name, key) || o->val == 'h')
				continue;
			if (o->has_arg == required_argument && !eq) {
				fprintf(stderr, "tpfs: -o %s: give %s=VALUE (as --%s VALUE)\n", key, key, o->name);
				return 2;
			}
			if (o->has_arg == no_argument && eq) {
				fprintf(stderr, "tpfs: -o %.*s: %s takes no value\n", (int)n, s, key);
				return 2;
			}
			const char *val = NULL;
			if (eq) {
				size_t vl = n - kl - 1;
				if (a->nvals + vl + 1 > sizeof a->vals) {
					fprintf(stderr, "tpfs: -o: the values are too long (at most %zu characters)\n", sizeof a->vals);
					return 2;
				}
				char *v = a->vals + a->nvals;
				memcpy(v, eq + 1, vl);
				v[vl] = 0;
				a->nvals += vl + 1;
				if (o->val == 'K' || o->val == 'G')
					for (char *p = v; *p; p++)
						*p = *p == ':' ? ',' : *p;
				val = v;
			}
			return mount_option(o->val, val, a);
		}
	}
	fprintf(stderr, "tpfs: -o %.*s: not an option of tpfs mount (given as key=value: tp=N, ranks=0-7, view=vllm, "
		"...: tpfs mount --help) nor a FUSE mount option tpfs passes on\n", (int)n, s);
	return 2;
}

/* Every option of tpfs mount, c as getopt_long gives it (mount_lo) with its argument arg (NULL where none),
 * into a. Returns 0, 1 after --help (printed), or 2 after a usage error. */
static int mount_option(int c, const char *arg, struct mount_args *a)
{
	tp_fs_opts *fo = &a->fo;
	uint32_t v;
	int k = model_option(c, arg, &a->mo, &a->have_t, usage_mount);
	if (k == 2)
		return 2;
	if (k == 1)
		return 0;
	switch (c) {
	case 'f': fo->foreground = 1; break;
	case 'd': fo->debug = fo->foreground = 1; tp_log_debug = 1; break;
	case 'o':
		for (const char *s = arg, *end; *s; s = *end ? end + 1 : end) {
			end = strchr(s, ',');
			if (!end)
				end = s + strlen(s);
			if (mount_o_item(s, (size_t)(end - s), a))
				return 2;
		}
		break;
	case 'R':
		if (parse_u32(arg, &fo->readahead_kb) < 0)
			return die_usage(usage_mount, "--readahead: give KiB (0 leaves the kernel's default)");
		break;
	case 'j':
		if (parse_u32(arg, &fo->threads) < 0 || fo->threads < 1 || fo->threads > 1024)
			return die_usage(usage_mount, "--threads: give 1..1024");
		break;
	case 'L': fo->log_path = arg; break; /* made absolute by cmd_mount: the daemon leaves the folder */
	case 'c':
		if (strcmp(arg, "local") && strcmp(arg, "global"))
			return die_usage(usage_mount, "--config: local or global");
		a->mo.config_global = arg[0] == 'g';
		break;
	case 'g':
		if (strcmp(arg, "auto") && strcmp(arg, "cpu") && strcmp(arg, "cuda"))
			return die_usage(usage_mount, "--gather: auto, cpu or cuda");
		fo->gather = !strcmp(arg, "cpu") ? TP_GATHER_CPU : !strcmp(arg, "cuda") ? TP_GATHER_CUDA : TP_GATHER_AUTO;
		break;
	case 'y':
		if (strcmp(arg, "auto") && strcmp(arg, "iov") && strcmp(arg, "copy"))
			return die_usage(usage_mount, "--reply: auto, iov or copy");
		fo->reply = arg[0] == 'i' ? 1 : arg[0] == 'c' ? 2 : 0;
		break;
	case 'b':
		if (parse_u32(arg, &fo->max_background) < 0 || fo->max_background < 1 || fo->max_background > 65535)
			return die_usage(usage_mount, "--max-background: give 1..65535");
		break;
	case 'C':
		if (parse_u32(arg, &fo->cuda_min_runs) < 0)
			return die_usage(usage_mount, "--cuda-min-runs: give a number of runs");
		break;
	case 'B':
		if (parse_u32(arg, &v) < 0)
			return die_usage(usage_mount, "--cuda-min-bytes: give a number of bytes (below 4 GiB)");
		fo->cuda_min_bytes = v;
		break;
	case 'P':
		if (strcmp(arg, "on") && strcmp(arg, "off"))
			return die_usage(usage_mount, "--release-pages: on or off");
		fo->release_pages = arg[1] == 'n';
		break;
	case 'X':
		if (strcmp(arg, "on") && strcmp(arg, "off"))
			return die_usage(usage_mount, "--passthrough: on or off");
		fo->passthrough = arg[1] == 'n';
		break;
	case 'Z':
		if (parse_u32(arg, &fo->pass_keep) < 0 || fo->pass_keep > 7 * 86400)
			return die_usage(usage_mount, "--passthrough-keep: give seconds, at most 604800 (a week)");
		break;
	case 'K':
		if (a->ranks)
			return die_usage(usage_mount, "--ranks given twice: give one list, e.g. --ranks 0,1");
		a->ranks = arg;
		break;
	case 'I':
		if (strcmp(arg, "exact") && strcmp(arg, "readahead") && strcmp(arg, "random"))
			return die_usage(usage_mount, "--source-io: exact, readahead or random");
		fo->source_io = arg[0] == 'e' ? 0 : arg[0] == 'r' && arg[1] == 'e' ? 1 : 2;
		break;
	case 'J':
		if (strcmp(arg, "auto") && strcmp(arg, "direct") && strcmp(arg, "map"))
			return die_usage(usage_mount, "--push-io: auto, direct or map");
		fo->push_io = arg[0] == 'a' ? -1 : arg[0] == 'm';
		break;
	case 'H':
		if (parse_push(arg, &fo->push) < 0)
			return die_usage(usage_mount, "--push: off, auto, or a size in bytes (suffix K, M, G or T: binary)");
		break;
	case 'N': {
		char *end;
		long n = strtol(arg, &end, 10);
		if (!strcmp(arg, "keep"))
			fo->nice = TP_NICE_KEEP;
		else if (end == arg || *end || n < -20 || n > 19)
			return die_usage(usage_mount, "--nice: give -20..19, or keep");
		else
			fo->nice = (int)n;
		break;
	}
	case 'h': fputs(usage_mount, stdout); return 1;
	default: return die_usage(usage_mount, NULL);
	}
	return 0;
}

static int cmd_mount(int argc, char **argv)
{
	static struct mount_args a; /* static: 12 KiB of buffers, and one mount per process */
	a = (struct mount_args){.mo = {.log = tp_log_model},
				.fo = {.readahead_kb = 4096, .threads = 16, .gather = TP_GATHER_AUTO,
				       .release_pages = -1, .mnt_lock = -1, .push = -1, .push_io = -1,
				       .pass_keep = 600, .nice = TP_NICE_DEFAULT}};
	tp_model_opts mo;
	tp_fs_opts fo;
	const char *ranks;
	int c;
	while ((c = getopt_long(argc, argv, "fdo:h", mount_lo, NULL)) != -1) {
		int k = mount_option(c, optarg, &a);
		if (k)
			return k == 1 ? 0 : 2;
	}
	mo = a.mo;
	fo = a.fo;
	ranks = a.ranks;
	if (argc - optind != 2)
		return die_usage(usage_mount, "give SRC and MNT");
	if (!a.have_t)
		return die_usage(usage_mount, "--tp N is required (-o tp=N as a mount option)");
	if (model_options_check(&mo, usage_mount))
		return 2;
	uint8_t serve[TP_MAX_T];
	if (ranks) {
		tp_err re;
		/* with stages: rank = stage x T + TP rank; with DP ranks: DP rank x T + TP rank */
		uint64_t nr = (uint64_t)mo.T * (mo.pp > 1 ? mo.pp : 1) * (mo.dp > 1 ? mo.dp : 1);
		if (nr > TP_MAX_T)
			return die_usage(usage_mount, "--pp x --dp x --tp: at most 1024 ranks in all");
		if (tp_ranks_parse(ranks, (uint32_t)nr, serve, &fo.nserve, &re) < 0)
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
	if (!strncmp(mnt, "/dev/fd/", 8)) { /* mount.fuse3's drop_privileges: it opened /dev/fuse and mounted it */
		fprintf(stderr, "tpfs: %s: a FUSE file descriptor (mount.fuse3's drop_privileges): tpfs makes its own mount; "
			"leave drop_privileges out (setuid=USER runs tpfs as USER)\n", mnt);
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
	/* --log FILE is opened by the daemon once it serves (fs_log.c), for appending: a FIFO there would
	 * hold the daemon in open() until a reader came, with the mount made and every access to it
	 * waiting (a folder or a socket fails to open, and the log goes to syslog, as it says) */
	if (fo.log_path && stat(fo.log_path, &st) == 0 && S_ISFIFO(st.st_mode)) {
		fprintf(stderr, "tpfs: --log %s: a FIFO: the daemon would wait in open() for a reader, with the mount "
			"made and every access to it waiting; give a regular file (or leave --log out: syslog)\n", fo.log_path);
		return 1;
	}
	/* Mounting is exclusive: an flock on MNT's folder, taken before the mount-point check and
	 * held (by the daemon) until its mount exists, so that of two mounts started at once the
	 * second sees the first's lock or its mount, never neither (issue 19). The second waits for
	 * the lock (up to LOCK_WAIT_S) rather than failing at once: the first's mount may be in
	 * another mount namespace (one per node of a multi-node test, containers), where this one
	 * does not see it and may mount too; in the same namespace it then sees the mount. */
	int lockfd = open(rmnt, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (lockfd >= 0 && flock(lockfd, LOCK_EX | LOCK_NB) < 0) {
		int err = errno, waited = 0;
		while (err == EWOULDBLOCK && waited < LOCK_WAIT_S * 20) {
			if (waited++ == 20)
				fprintf(stderr, "tpfs: %s: another tpfs is mounting it; waiting (up to %d s)\n", mnt, LOCK_WAIT_S);
			struct timespec ts = {0, 50 * 1000 * 1000};
			nanosleep(&ts, NULL);
			err = flock(lockfd, LOCK_EX | LOCK_NB) < 0 ? errno : 0;
		}
		if (err) {
			close(lockfd);
			if (err == EWOULDBLOCK) {
				fprintf(stderr, "tpfs: %s: already a mount point (another tpfs has been mounting it for %d s); "
					"unmount it first\n", mnt, LOCK_WAIT_S);
				return 1;
			}
			lockfd = -1; /* a file system without flock: the check after mounting remains */
		}
	}
	if (is_mountpoint(rmnt, fstype, sizeof fstype)) {
		fprintf(stderr, "tpfs: %s: already a mount point (%s); unmount it first\n", mnt, fstype);
		if (lockfd >= 0)
			close(lockfd);
		return 1;
	}
	fo.mnt_lock = lockfd;
	if (under(rmnt, rsrc)) {
		fprintf(stderr, "tpfs: %s is inside %s: the mount would contain itself; mount elsewhere\n", mnt, src);
		goto refused;
	}
	if (under(rsrc, rmnt)) {
		fprintf(stderr, "tpfs: %s is inside %s: the mount would hide its own source; mount elsewhere\n", src, mnt);
		goto refused;
	}
	char rlog[PATH_MAX], cwd[PATH_MAX];
	if (fo.log_path && fo.log_path[0] != '/' && getcwd(cwd, sizeof cwd) &&
	    snprintf(rlog, sizeof rlog, "%s/%s", cwd, fo.log_path) < (int)sizeof rlog)
		fo.log_path = rlog; /* as the mount message and the stats file name it */
	mo.src = rsrc;
	mo.mnt = rmnt;
	fo.mnt = rmnt;
	fo.fuse_opts = a.fuse_opts[0] ? a.fuse_opts : NULL;
	if (fo.gather == TP_GATHER_CUDA) {
		char why[512];
		if (tp_cuda_available(why, sizeof why) < 0) {
			fprintf(stderr, "tpfs: --gather cuda: %s; use --gather auto or cpu\n", why);
			goto refused;
		}
	}
	tp_model m;
	tp_err e;
	tp_err_clear(&e);
	int orc = tp_model_open(&m, &mo, &e);
	tp_log_repeats();
	if (orc < 0) {
		fprintf(stderr, "tpfs: %s\n", e.msg);
		goto refused;
	}
	if (tp_fs_nofile(m.ntensor_files + 64, &e) < 0) {
		fprintf(stderr, "tpfs: %s\n", e.msg);
		tp_model_close(&m);
		goto refused;
	}
	int parent = 0;
	int rc = tp_fs_main(&m, &fo, &parent, &e); /* closes fo.mnt_lock once the mount exists */
	if (rc < 0 && (parent || fo.foreground))
		fprintf(stderr, "tpfs: %s\n", e.msg);
	if (rc == 0 && parent) /* the daemon's messages (a file it failed, and why) go elsewhere from now on */
		fprintf(stderr, "tpfs: mounted at %s; the daemon logs to %s; `tpfs stats %s` lists files that failed\n",
			rmnt, fo.log_path ? fo.log_path : "syslog (tag tpfs: journalctl -t tpfs)", mnt);
	tp_model_close(&m);
	return rc < 0 ? 1 : 0;
refused:
	if (lockfd >= 0)
		close(lockfd);
	return 1;
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
		/* EBUSY is retried for up to 2 s: a lookup still walking the mount (the daemon's own ready
		 * helper stats the mount point as it comes up, an `ls` finishing) holds it for a moment; a file
		 * that stays open is still refused, after that grace */
		int err = 0;
		for (int tries = 0; tries < 40; tries++) {
			if (umount2(rmnt, lazy ? MNT_DETACH : 0) == 0)
				return 0;
			err = errno;
			if (err != EBUSY || lazy)
				break;
			nanosleep(&(struct timespec){0, 50 * 1000 * 1000}, NULL);
		}
		fprintf(stderr, "tpfs: umount %s: %s%s\n", argv[optind], strerror(err),
			err == EBUSY ? " (files are open; close them or use --lazy)" : "");
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
	for (uint32_t i = 0; i < m.tree.nn; i++) {
		const tp_node *n = &m.tree.n[i];
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
	/* opened as every file named on the command line is: a FIFO there is refused, not waited on */
	tp_err oe;
	struct stat sst;
	int sfd = tp_open_regular(path, path, NULL, &sst, &oe);
	FILE *f = sfd < 0 ? NULL : fdopen(sfd, "r");
	if (sfd >= 0 && !f)
		close(sfd);
	if (!f) {
		if (sfd < 0 && oe.code == TP_EINVAL)
			fprintf(stderr, "tpfs: %s (is %s a tpfs mount?)\n", oe.msg, argv[1]);
		else if (errno == ENOTCONN)
			fprintf(stderr, "tpfs: %s: the tpfs daemon serving it is gone (killed or crashed); "
				"`tpfs umount %s` removes the dead mount\n", argv[1], argv[1]);
		else
			fprintf(stderr, "tpfs: %s: %s (is %s a tpfs mount?)\n", path, strerror(errno), argv[1]);
		return 1;
	}
	/* the file is padded with spaces to the size stat gives: print it without them */
	size_t n = 0, cap = 1 << 16;
	char *buf = malloc(cap);
	for (size_t got = 1; buf && got;) {
		if (n == cap) {
			char *b = realloc(buf, cap *= 2);
			if (!b)
				break;
			buf = b;
		}
		n += got = fread(buf + n, 1, cap - n, f);
	}
	fclose(f);
	if (!buf) {
		fprintf(stderr, "tpfs: out of memory\n");
		return 1;
	}
	while (n && (buf[n - 1] == ' ' || buf[n - 1] == '\n'))
		n--;
	fwrite(buf, 1, n, stdout);
	fputc('\n', stdout);
	free(buf);
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
	/* mount(8)'s form, as mount.fuse3 runs a fuse.tpfs mount (fstab, mount -t fuse.tpfs, a systemd mount
	 * unit): tpfs SRC MNT -o tp=N,...; told from a mistyped command by a slash or an existing SRC */
	struct stat st;
	if (argc >= 2 && cmd[0] != '-' && (strchr(cmd, '/') || stat(cmd, &st) == 0)) {
		return cmd_mount(argc + 1, argv - 1); /* argv[-1]: the program's name, which getopt skips */
	}
	char msg[256];
	snprintf(msg, sizeof msg, "unknown command '%s'", cmd);
	return die_usage(usage_main, msg);
}
