/*-------------------------------------------------------------------------
 *
 * settings.h
 *	  The ratebucket.* settings (settings.c): the defaults of the feedback
 *	  policy, and the storage path.
 *
 *-------------------------------------------------------------------------
 */
#ifndef RATEBUCKET_BUCKET_SETTINGS_H
#define RATEBUCKET_BUCKET_SETTINGS_H

#include "core/feedback.h"

/* The policy's defaults, as the settings hold them now. */
extern RbSettings rb_settings;

/* ratebucket.direct_access */
extern bool rb_direct_access;

/* ratebucket.events */
extern bool rb_events;

extern void rb_settings_init(void);

#endif							/* RATEBUCKET_BUCKET_SETTINGS_H */
