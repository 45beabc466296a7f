/* ratebucket--1.10--1.11.sql */

-- ratebucket 1.10 -> 1.11: lock-outs.  A 429 to the first requests after a
-- throttle episode's cooldown (a destination that counts requests in a
-- window, refused ones included, or holds a penalty) doubles the cooldown
-- instead of lowering the rate again; the row keeps when its cooldown began
-- and how long the last lock-out lasted.

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION ratebucket UPDATE TO '1.11'" to load this file. \quit

ALTER TABLE ratebucket.buckets ADD COLUMN cooldown_from timestamptz;
ALTER TABLE ratebucket.buckets ADD COLUMN lockout_seconds float8;

COMMENT ON COLUMN ratebucket.buckets.cooldown_from IS
'When the cooldown ending at cooldown_until began: a 429 that locks the sender out right after it doubles its length.';
COMMENT ON COLUMN ratebucket.buckets.lockout_seconds IS
'How long the last lock-out kept the destination closed, in seconds (its cooldowns since the episode began); a rate must hold that long and 10 s more before it counts as one that held. NULL: no lock-out seen.';
