# ratebucket: PGXS build of two extensions, each version written only in its
# control file: ratebucket (the buckets, a C module) and ratebucket_queue (a
# delivery queue on them, SQL only).
EXTENSION = ratebucket ratebucket_queue
control_version = $(shell sed -n "s/^default_version[[:space:]]*=[[:space:]]*'\([^']*\)'.*/\1/p" $(1).control)
EXTVERSION = $(call control_version,ratebucket)
QUEUE_VERSION = $(call control_version,ratebucket_queue)

MODULE_big = ratebucket
# The layers of src/, each calling only the ones listed before it:
# core (pure C, no PostgreSQL headers), bucket, engine, api (the SQL-callable
# functions), and the module's entry point.  See doc/internals.md.
CORE_OBJS = $(patsubst %.c,%.o,$(sort $(wildcard src/core/*.c)))
BUCKET_OBJS = $(patsubst %.c,%.o,$(sort $(wildcard src/bucket/*.c)))
ENGINE_OBJS = $(patsubst %.c,%.o,$(sort $(wildcard src/engine/*.c)))
API_OBJS = $(patsubst %.c,%.o,$(sort $(wildcard src/api/*.c)))
OBJS = $(CORE_OBJS) $(BUCKET_OBJS) $(ENGINE_OBJS) $(API_OBJS) \
	src/ratebucket.o

# SQL: sql/install/ratebucket.sql is the current surface, built into the
# install script of the current version.  The released scripts are shipped as
# they are: 1.0's install script (the upgrade test starts there) and every
# update, sql/updates/ratebucket--<from>--<to>.sql.
# The same for ratebucket_queue, whose current surface is split by concern
# into sql/install/ratebucket_queue/*.sql (tables, the claim's inputs,
# parking, the claim, recording, upkeep, explanations, the per-endpoint
# functions, Citus), concatenated in name order into the install script of
# its current version; its 1.0 install script and its updates are shipped
# as they are.
DATA_built = sql/install/ratebucket--$(EXTVERSION).sql \
	sql/install/ratebucket_queue--$(QUEUE_VERSION).sql
DATA = sql/install/ratebucket--1.0.sql $(wildcard sql/updates/ratebucket--*--*.sql) \
	sql/install/ratebucket_queue--1.0.sql \
	$(wildcard sql/updates/ratebucket_queue--*--*.sql)

# pg_regress: every sql/*.sql, outputs in expected/.  Each file installs the
# extension afresh and cleans up after itself, so any order passes (test/run
# also runs them in reverse order).
REGRESS = $(patsubst sql/%.sql,%,$(sort $(wildcard sql/*.sql)))
REGRESS_OPTS = --inputdir=.

# Isolation specs: test/isolation/specs/*.spec, outputs in
# test/isolation/expected/.
ISOLATION = $(patsubst test/isolation/specs/%.spec,%,$(sort $(wildcard test/isolation/specs/*.spec)))
ISOLATION_OPTS = --inputdir=test/isolation --load-extension=ratebucket

# TAP tests (need libipc-run-perl): test/t/*.pl, with their shared helpers
# in test/perl/.
TAP_TESTS = 1
PROVE_TESTS = test/t/*.pl

PG_CONFIG ?= pg_config

# Our own code builds warning-free under -Wall -Wextra.  PostgreSQL's headers
# do not (unused parameters in inline functions), so they are included as
# system headers, which silences warnings in them and only in them.
PG_CPPFLAGS = -I$(srcdir)/src -isystem $(shell $(PG_CONFIG) --includedir-server) \
	-DRATEBUCKET_VERSION=\"$(EXTVERSION)\"
PG_CFLAGS = -Wall -Wextra

EXTRA_CLEAN = output_iso tmp_check tmp_check_iso results regression.diffs regression.out \
	output_reverse

PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

# The install script of the current version is a copy of the current surface.
sql/install/ratebucket--$(EXTVERSION).sql: sql/install/ratebucket.sql
	cp $< $@
QUEUE_PARTS = $(sort $(wildcard sql/install/ratebucket_queue/*.sql))
sql/install/ratebucket_queue--$(QUEUE_VERSION).sql: $(QUEUE_PARTS)
	for f in $^; do cat $$f; echo; done > $@
