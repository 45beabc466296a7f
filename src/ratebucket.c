/*-------------------------------------------------------------------------
 *
 * ratebucket.c
 *	  Module entry point: PG_MODULE_MAGIC and a thin _PG_init.
 *
 * ratebucket needs no shared_preload_libraries: the library loads on the
 * first call.  Preloaded, it also has token reserves in shared memory for
 * the endpoints given one (bucket/reserve.c).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "fmgr.h"

#include "bucket/reserve.h"
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
	/* before rb_settings_init reserves the prefix ratebucket. */
	rb_reserve_init();
	rb_settings_init();
	rb_storage_init();
}
