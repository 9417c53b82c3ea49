/* plan_builtin.c: the plan files of plans/ compiled into the binary (see plan_builtin.h). */
#include "plan_builtin.h"

#include <string.h>

#include "plans_data.h"

int tp_builtin_count(void)
{
	return (int)(sizeof builtin_plans / sizeof builtin_plans[0]);
}

const char *tp_builtin_name(int i)
{
	return i >= 0 && i < tp_builtin_count() ? builtin_plans[i].name : NULL;
}

const char *tp_builtin_text(int i, size_t *len)
{
	if (i < 0 || i >= tp_builtin_count())
		return NULL;
	*len = strlen(builtin_plans[i].text);
	return builtin_plans[i].text;
}

int tp_builtin_find(const char *name)
{
	for (int i = 0; i < tp_builtin_count(); i++)
		if (strcmp(builtin_plans[i].name, name) == 0)
			return i;
	return -1;
}
