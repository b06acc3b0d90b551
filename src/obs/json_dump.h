/* JSON text of a jansson value that is either whole or NULL.
 *
 * jansson's own json_dumps() can return a document with a hole in it:
 * when writing an object key runs out of memory, its dumper ignores that
 * failure and goes on with the value (docs/testing.md, "Allocation-failure
 * testing"), so a client would get `{"a":1,:2}` or a config without a key.
 * Every subsystem that renders JSON for someone else goes through here. */
#ifndef LMC_OBS_JSON_DUMP_H
#define LMC_OBS_JSON_DUMP_H

#include <jansson.h>
#include <stddef.h>

/* As json_dumps(v, flags); NULL when any part of it could not be written.
 * The caller free()s the text. */
char *lmc_json_dumps(const json_t *v, size_t flags);

#endif
