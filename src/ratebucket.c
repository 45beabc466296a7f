/*-------------------------------------------------------------------------
 *
 * ratebucket.c
 *	  Module entry point: PG_MODULE_MAGIC and a thin _PG_init.
 *
 * ratebucket needs no shared memory and no background worker, so it does
 * not need shared_preload_libraries: the library loads on the first call.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "fmgr.h"

#include "bucket/settings.h"
#include "bucket/storage.h"

PG_MODULE_MAGIC;

void		_PG_init(void);

/*
 * _PG_init
 *		Define the ratebucket.* settings and initialise each part.
 */
void
_PG_init(void)
{
	rb_settings_init();
	rb_storage_init();
}
