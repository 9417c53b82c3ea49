/* fs_mem.c: how much memory the daemon may use for pages it makes ahead of reads: the push's budget
 * (--push auto: a quarter of MemAvailable, or of the memory cgroup's limit where that is lower; the
 * kernel charges stored pages and tmpfs copies to the daemon's cgroup, so a budget sized by the
 * machine would only evict the engine's pages in a container given less; issue 50), and whether
 * memory is short now (fs_pass.c moves its copies into the page cache then). Reads /proc/meminfo
 * and the cgroup files; a leaf: it calls no other room of the file system layer.
 */
#include "fs_int.h"

/* The memory limit of the limit file name in cgroup folder dir, or 0 for none ("max", v1's
 * "unlimited" of about 2^63, or unreadable). */
static uint64_t limit_in(const char *dir, const char *name)
{
	char path[PATH_MAX + 64], v[32] = "";
	if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path)
		return 0;
	FILE *f = fopen(path, "r");
	int ok = f && fgets(v, sizeof v, f) != NULL;
	if (f)
		fclose(f);
	unsigned long long n;
	char end;
	if (!ok || sscanf(v, "%llu%c", &n, &end) != 2 || end != '\n' || n >= (1ull << 60))
		return 0;
	return n;
}

/* The lowest memory limit (bytes) set on this process's memory cgroup or one above it, up to the
 * hierarchy's root as mounted here (v1: memory.limit_in_bytes under /sys/fs/cgroup/memory; v2:
 * memory.max under /sys/fs/cgroup), or 0 where none is set or none can be read. *use: the memory
 * charged to the cgroup of that limit (v1: memory.usage_in_bytes; v2: memory.current), 0 unread. */
static uint64_t cgroup_memory_limit(uint64_t *use)
{
	*use = 0;
	FILE *f = fopen("/proc/self/cgroup", "r");
	char line[PATH_MAX + 128];
	uint64_t lim = 0;
	while (f && fgets(line, sizeof line, f)) {
		line[strcspn(line, "\n")] = 0;
		char *ctl = strchr(line, ':'), *path = ctl ? strchr(ctl + 1, ':') : NULL; /* "ID:CONTROLLERS:PATH" */
		if (!path)
			continue;
		*ctl++ = 0;
		*path++ = 0;
		const char *base = NULL, *file = NULL, *used = NULL; /* v1's memory hierarchy, or v2's unified one */
		for (char *c = ctl, *save = NULL, *t; !base && (t = strtok_r(c, ",", &save)); c = NULL)
			if (!strcmp(t, "memory"))
				base = "/sys/fs/cgroup/memory", file = "memory.limit_in_bytes", used = "memory.usage_in_bytes";
		if (!base && !strcmp(line, "0") && !*ctl)
			base = "/sys/fs/cgroup", file = "memory.max", used = "memory.current";
		if (!base)
			continue;
		char dir[PATH_MAX];
		struct stat st;
		if (snprintf(dir, sizeof dir, "%s%s", base, path) >= (int)sizeof dir || stat(dir, &st) != 0)
			snprintf(dir, sizeof dir, "%s", base); /* the path is outside what is mounted here: the mount's root */
		for (;;) { /* the cgroup, then each parent up to the mount's root */
			uint64_t l = limit_in(dir, file);
			if (l && (!lim || l < lim)) {
				lim = l;
				*use = limit_in(dir, used);
			}
			char *slash = strrchr(dir, '/');
			if (strlen(dir) <= strlen(base) || !slash)
				break;
			*slash = 0;
		}
	}
	if (f)
		fclose(f);
	return lim;
}

/* MemAvailable and MemTotal (bytes; 0 where unread). */
static void meminfo(uint64_t *avail, uint64_t *total)
{
	*avail = *total = 0;
	FILE *f = fopen("/proc/meminfo", "r");
	char line[256];
	while (f && fgets(line, sizeof line, f)) {
		unsigned long long kb;
		if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
			*avail = (uint64_t)kb * 1024;
		else if (sscanf(line, "MemTotal: %llu kB", &kb) == 1)
			*total = (uint64_t)kb * 1024;
	}
	if (f)
		fclose(f);
}

int push_memory_short(void)
{
	uint64_t room, whole, use;
	meminfo(&room, &whole);
	uint64_t lim = cgroup_memory_limit(&use);
	if (lim && (!whole || lim < whole)) { /* the cgroup's room, where it is the tighter */
		whole = lim;
		if (use && (lim > use ? lim - use : 0) < room)
			room = lim > use ? lim - use : 0;
	}
	return whole && room < whole / 8;
}

uint64_t push_budget_of(const tp_fs_opts *o)
{
	if (o->push == 0)
		return 0;
	uint64_t avail, total, use;
	meminfo(&avail, &total);
	uint64_t lim = cgroup_memory_limit(&use); /* pushed pages are charged to the daemon's cgroup */
	if (lim && (!avail || lim < avail))
		avail = lim;
	if (o->push < 0)
		return avail / 4;
	return avail && (uint64_t)o->push > avail ? avail : (uint64_t)o->push;
}
