/* plan_builtin.c: the plan files of plans/ compiled into the binary, and the families examined and not
 * served (see plan_builtin.h). */
#include "plan_builtin.h"

#include <string.h>

#include "examined_data.h"
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

const char *tp_builtin_examined(const char *model_type)
{
	for (size_t i = 0; model_type && i < sizeof builtin_examined / sizeof builtin_examined[0]; i++)
		if (strcmp(builtin_examined[i].model_type, model_type) == 0)
			return builtin_examined[i].why;
	return NULL;
}
