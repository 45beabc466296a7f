# ratebucket: PGXS build.  The version is written only in ratebucket.control.
EXTENSION = ratebucket
EXTVERSION = $(shell sed -n "s/^default_version[[:space:]]*=[[:space:]]*'\([^']*\)'.*/\1/p" $(EXTENSION).control)

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

DATA = $(wildcard sql/$(EXTENSION)--*.sql)

# pg_regress: inputs in sql/, outputs in expected/.
REGRESS = setup take storage claim take_all batch quota inflight configure admin feedback headers errors stripe privileges upgrade
REGRESS_OPTS = --inputdir=.

# Isolation specs: test/specs/*.spec, outputs in test/expected/.
ISOLATION = take-last-token take-refused-nowait take-optimistic ready-nowait take-upto take-all quota-last-unit inflight-last-slot configure-take configure-new-endpoint observe-take stripe-skip take-batch
ISOLATION_OPTS = --inputdir=test --load-extension=$(EXTENSION)

# TAP tests (need libipc-run-perl): load checks, later crash/standby/dump.
TAP_TESTS = 1
PROVE_TESTS = test/t/*.pl

PG_CONFIG ?= pg_config

# Our own code builds warning-free under -Wall -Wextra.  PostgreSQL's headers
# do not (unused parameters in inline functions), so they are included as
# system headers, which silences warnings in them and only in them.
PG_CPPFLAGS = -I$(srcdir)/src -isystem $(shell $(PG_CONFIG) --includedir-server) \
	-DRATEBUCKET_VERSION=\"$(EXTVERSION)\"
PG_CFLAGS = -Wall -Wextra

EXTRA_CLEAN = output_iso tmp_check tmp_check_iso results regression.diffs regression.out

PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)
