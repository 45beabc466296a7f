/*-------------------------------------------------------------------------
 *
 * guc.h
 *	  ratebucket.* settings: the defaults of the feedback policy.
 *
 *-------------------------------------------------------------------------
 */
#ifndef RATEBUCKET_GUC_H
#define RATEBUCKET_GUC_H

extern double rb_throttle_factor;
extern double rb_floor_fraction;
extern double rb_recovery_factor;
extern int	rb_recovery_interval_s;
extern int	rb_default_cooldown_ms;
extern int	rb_min_cooldown_ms;
extern int	rb_max_cooldown_ms;
extern int	rb_breaker_failures;
extern int	rb_breaker_open_ms;
extern int	rb_breaker_max_open_ms;
extern bool rb_direct_access;

extern void rb_guc_init(void);

#endif							/* RATEBUCKET_GUC_H */
