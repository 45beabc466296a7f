/*-------------------------------------------------------------------------
 *
 * striped.h
 *	  The take of a striped endpoint (striped.c), for take.c.
 *
 *-------------------------------------------------------------------------
 */
#ifndef RATEBUCKET_ENGINE_STRIPED_H
#define RATEBUCKET_ENGINE_STRIPED_H

#include "engine/engine.h"

extern bool rb_take_striped(text *endpoint, int k, const RbTakeRequest *req,
							RbTakeResult *result, double *granted);
extern RbTakeResult rb_take_striped_now(text *endpoint,
										const RbTakeRequest *req,
										double *granted);

#endif							/* RATEBUCKET_ENGINE_STRIPED_H */
