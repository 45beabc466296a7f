# shellcheck shell=bash
# bench/lib.sh — shell functions shared by bench/run and bench/run-scale.
# Sourced, never run.  The caller sets `set -euo pipefail` and umask 022 first,
# then BENCH_NAME (for messages), and calls, in order:
#
#   bench_parse_args "$@"        --no-install, -h
#   bench_init                   privileges (IS_ROOT, BENCH_USER, as_root)
#   bench_install_packages       unless --no-install (uses PACKAGES)
#   bench_tools prog...          PG_CONFIG -> BINDIR; checks the programs
#   bench_workdir                the bench user, mktemp -d WORK, the exit trap
#   bench_build_install          copy the tree, build, make install (private
#                                copy of PostgreSQL by default) -> LIBFILE
#   bench_start_pg FIRST_PORT    initdb + start in WORK, CREATE DATABASE $DB
#   bench_check_mapped           which ratebucket.so a backend maps
#   bench_machine                CPU_MODEL, NPROC, MEM, OS, KERNEL, HYPERVISOR, FS
#
# and then uses as_user / psql_q / check_lib / cpu_snap / steal_pct / wal_measure.
# The caller may define bench_on_exit_hook (called first by the exit trap,
# e.g. to stop Redis).

# ------------------------------------------------------------------ helpers --

BENCH_NAME="${BENCH_NAME:-bench}"
say()  { printf '\n==> %s\n' "$*" >&2; }
info() { printf '    %s\n' "$*" >&2; }
warn() { printf '    WARNING: %s\n' "$*" >&2; }
die()  { printf '\n%s: ERROR: %s\n' "$BENCH_NAME" "$*" >&2; exit 1; }
usage() { sed -n '3,8p' "$0" | sed 's/^# \{0,1\}//'; }
is_uint() { [[ "$1" =~ ^[0-9]+$ ]]; }

BENCH_USER_AS_ROOT=ratebucket_bench
PG_CONFIG="${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}"
INSTALL_MODE="${BENCH_INSTALL:-private}"
KEEP="${BENCH_KEEP:-0}"
DB="${DB:-ratebucket_bench}"
SRCDIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

bench_parse_args() {
    INSTALL_PACKAGES=1
    local arg
    for arg in "$@"; do
        case "$arg" in
            --no-install) INSTALL_PACKAGES=0 ;;
            -h|--help) usage; exit 0 ;;
            *) usage >&2; die "unknown argument: $arg" ;;
        esac
    done
    case "$INSTALL_MODE" in private|system) ;; *) die "BENCH_INSTALL must be private or system" ;; esac
}

# -------------------------------------------------------------- privileges --

bench_init() {
    if [ "$(id -u)" -eq 0 ]; then
        IS_ROOT=1
        BENCH_USER="$BENCH_USER_AS_ROOT"
    else
        IS_ROOT=0
        BENCH_USER="$(id -un)"
    fi
}

as_root() {
    if [ "$IS_ROOT" -eq 1 ]; then
        "$@"
    else
        command -v sudo >/dev/null 2>&1 ||
            die "need root for: $*  — but sudo is not installed. Run as root, or install sudo."
        sudo "$@"
    fi
}

# ---------------------------------------------------------------- packages --

is_installed() {
    [ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null || true)" = "install ok installed" ]
}

bench_install_packages() {
    if [ "$INSTALL_PACKAGES" -eq 0 ]; then
        say "Skipping package installation (--no-install)"
        return
    fi
    if ! command -v dpkg-query >/dev/null 2>&1 || ! command -v apt-get >/dev/null 2>&1; then
        die "dpkg/apt not found: install $PACKAGES yourself, then run: $0 --no-install"
    fi
    local missing="" p
    for p in $PACKAGES; do
        is_installed "$p" || missing="$missing $p"
    done
    if [ -n "$missing" ]; then
        say "Installing missing packages:$missing"
        # apt's output goes to stderr: stdout is kept for the report.
        as_root apt-get update >&2
        # shellcheck disable=SC2086
        as_root env DEBIAN_FRONTEND=noninteractive \
            apt-get install -y --no-install-recommends -o DPkg::Lock::Timeout=300 $missing >&2
        # Note: on a systemd machine, installing redis-server also starts the
        # system service on port 6379.  The benchmark never uses it (it starts
        # its own instance on a free port); stop it with
        # `systemctl disable --now redis-server` if you do not want it.
    else
        say "All packages present ($PACKAGES); nothing to install"
    fi
}

# ------------------------------------------------------------------ tools --

bench_tools() {   # the PostgreSQL programs needed
    if [[ "$PG_CONFIG" != */* ]]; then
        PG_CONFIG="$(command -v "$PG_CONFIG" || true)"
    fi
    [ -n "$PG_CONFIG" ] && [ -x "$PG_CONFIG" ] ||
        die "pg_config not found (PG_CONFIG=${PG_CONFIG:-unset}). Install postgresql-server-dev-15 or set PG_CONFIG."
    BINDIR="$("$PG_CONFIG" --bindir)"
    local prog
    for prog in "$@"; do
        [ -x "$BINDIR/$prog" ] || die "$BINDIR/$prog not found (is the PostgreSQL server installed?)"
    done
    say "Using $("$PG_CONFIG" --version) ($PG_CONFIG)"
    INSTALL_AS_ROOT=1
    if [ "$INSTALL_MODE" = private ]; then
        INSTALL_AS_ROOT=0
    elif [ "$IS_ROOT" -eq 0 ] && [ -w "$("$PG_CONFIG" --pkglibdir)" ] &&
       [ -w "$("$PG_CONFIG" --sharedir)/extension" ]; then
        INSTALL_AS_ROOT=0
    fi
}

# ------------------------------------------------------- as the bench user --

WORK=""
PORT=""

# Run a command as the bench user, in directory $1, with the bench environment.
as_user_in() {
    local dir="$1"; shift
    local envs=(HOME="$WORK" USER="$BENCH_USER" LOGNAME="$BENCH_USER"
                PATH="$BINDIR:$PATH"
                PGHOST="$WORK" PGPORT="${PORT:-}" PGUSER="$BENCH_USER" PGDATABASE="$DB")
    if [ "$IS_ROOT" -eq 1 ]; then
        runuser -u "$BENCH_USER" -- env -C "$dir" "${envs[@]}" "$@"
    else
        env -C "$dir" "${envs[@]}" "$@"
    fi
}
as_user() { as_user_in "$WORK" "$@"; }
psql_q()  { as_user psql -X -q -A -t -v ON_ERROR_STOP=1 "$@"; }
# A file written by root for the bench user to read.
give_user() { [ "$IS_ROOT" -eq 0 ] || chown "$BENCH_USER:" "$@"; }

# ------------------------------------------------------------ temp + trap --

PG_STARTED=0
ALL_OK=1

bench_on_exit() {
    local rc=$?
    set +e
    if declare -F bench_on_exit_hook >/dev/null; then bench_on_exit_hook; fi
    if [ "$PG_STARTED" -eq 1 ]; then
        say "Stopping PostgreSQL"
        as_user "$BINDIR/pg_ctl" -D "$WORK/data" -m fast -w -t 60 stop >/dev/null ||
            as_user "$BINDIR/pg_ctl" -D "$WORK/data" -m immediate -w stop >/dev/null
    fi
    if [ -n "$WORK" ] && [ -d "$WORK" ]; then
        # Kept when asked, and after a failure (logs); not after Ctrl-C / kill.
        if [ "$KEEP" = 1 ] || { [ "$rc" -ne 0 ] && [ "$rc" -ne 130 ] && [ "$rc" -ne 143 ]; }; then
            if [ "$rc" -ne 0 ] && [ -s "$WORK/server.log" ]; then
                say "Tail of server log"
                tail -n 40 "$WORK/server.log" >&2
            fi
            printf '\n%s: work directory kept: %s\n' "$BENCH_NAME" "$WORK" >&2
        else
            rm -rf "$WORK"
        fi
    fi
    [ "$rc" -eq 0 ] || printf '\n%s: FAILED (exit %s)\n' "$BENCH_NAME" "$rc" >&2
    exit "$rc"
}

bench_workdir() {
    if [ "$IS_ROOT" -eq 1 ] && ! getent passwd "$BENCH_USER" >/dev/null; then
        say "Creating system user $BENCH_USER"
        useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin "$BENCH_USER"
    fi
    trap bench_on_exit EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    WORK="$(mktemp -d "${TMPDIR:-/tmp}/ratebucket-bench.XXXXXX")"
    cd "$WORK" || die "cannot enter $WORK"   # the bench user may not be able to enter the clone
}

# ------------------------------------------------------ copy, build, install --

bench_build_install() {
    # What is measured: the commit, and whether the build inputs differ from it.
    GIT_REV="$(git -C "$SRCDIR" rev-parse --short HEAD 2>/dev/null || echo 'unknown commit (no git)')"
    if [ -n "$(git -C "$SRCDIR" status --porcelain -- src sql Makefile ratebucket.control 2>/dev/null || true)" ]; then
        GIT_REV="$GIT_REV with uncommitted changes in src/, sql/ or Makefile"
    fi
    say "Copying $SRCDIR to $WORK/src"
    mkdir "$WORK/src"
    tar -C "$SRCDIR" -cf - \
        --exclude=./.git \
        --exclude='*.o' --exclude='*.so' --exclude='*.bc' \
        --exclude=./results --exclude=./output_iso --exclude=./log \
        --exclude=./tmp_check --exclude=./tmp_check_iso \
        --exclude=./regression.diffs --exclude=./regression.out \
        . | tar -C "$WORK/src" -xf -
    [ "$IS_ROOT" -eq 0 ] || chown -R "$BENCH_USER:" "$WORK"
    BENCHDIR="$WORK/src/bench"

    say "Building (make PG_CONFIG=$PG_CONFIG)"
    as_user_in "$WORK/src" make -s -j"$(nproc 2>/dev/null || echo 2)" PG_CONFIG="$PG_CONFIG" >"$WORK/build.log" 2>&1 ||
        { tail -n 40 "$WORK/build.log" >&2; die "build failed"; }
    local pkglibdir sharedir d
    pkglibdir="$("$PG_CONFIG" --pkglibdir)"
    sharedir="$("$PG_CONFIG" --sharedir)"
    if [ "$INSTALL_MODE" = private ]; then
        # A private copy of the PostgreSQL installation (bin, lib, share: ~50 MB),
        # and `make install DESTDIR=` into it.  PostgreSQL finds $libdir and its
        # share directory relative to its own executable, so the server started
        # from $PGROOT$BINDIR loads this build, whatever anyone installs
        # system-wide meanwhile (on a shared machine, test/run does it often).
        PGROOT="$WORK/pg"
        say "Installing (make install DESTDIR=$PGROOT, a private copy of PostgreSQL)"
        for d in "$BINDIR" "$pkglibdir" "$sharedir"; do
            mkdir -p "$PGROOT$(dirname "$d")"
            cp -a "$d" "$PGROOT$d"
        done
        rm -f "$PGROOT$pkglibdir"/ratebucket.so "$PGROOT$sharedir"/extension/ratebucket[.-]*
        [ "$IS_ROOT" -eq 0 ] || chown -R "$BENCH_USER:" "$PGROOT"
        as_user_in "$WORK/src" make -s install PG_CONFIG="$PG_CONFIG" DESTDIR="$PGROOT" >>"$WORK/build.log" 2>&1 ||
            { tail -n 40 "$WORK/build.log" >&2; die "make install failed"; }
        BINDIR="$PGROOT$BINDIR"
        LIBFILE="$PGROOT$pkglibdir/ratebucket.so"
    else
        say "Installing (make install, system-wide)"
        if [ "$INSTALL_AS_ROOT" -eq 1 ]; then
            as_root env -C "$WORK/src" make -s install PG_CONFIG="$PG_CONFIG" >>"$WORK/build.log" 2>&1
        else
            env -C "$WORK/src" make -s install PG_CONFIG="$PG_CONFIG" >>"$WORK/build.log" 2>&1
        fi || { tail -n 40 "$WORK/build.log" >&2; die "make install failed"; }
        LIBFILE="$pkglibdir/ratebucket.so"
    fi

    # Every new backend loads the library from LIBFILE: with BENCH_INSTALL=system a
    # concurrent test/run or make install by someone else would swap it under the
    # benchmark.  Checked by check_lib (and, in bench_check_mapped, which file a
    # backend maps).
    LIB_SUM="$(sha256sum <"$LIBFILE" | cut -d' ' -f1)"
    [ "$LIB_SUM" = "$(sha256sum <"$WORK/src/ratebucket.so" | cut -d' ' -f1)" ] ||
        die "$LIBFILE is not the library just built (a concurrent install?)"
    LIB_CHANGED=0
}

check_lib() {
    if [ "$(sha256sum <"$LIBFILE" | cut -d' ' -f1)" != "$LIB_SUM" ]; then
        warn "$LIBFILE changed since this run installed it (a concurrent make install or test/run?): new backends now load another build"
        LIB_CHANGED=1
    fi
}

# ---------------------------------------------------------------- servers --

tcp_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
pg_port_in_use() {
    [ -e "$WORK/.s.PGSQL.$1" ] || [ -e "/tmp/.s.PGSQL.$1" ] ||
    [ -e "/var/run/postgresql/.s.PGSQL.$1" ] || tcp_in_use "$1"
}

# Start a throwaway PostgreSQL as the bench user, unix socket in WORK, first
# free port from $1; extra postgresql.conf lines on stdin (may be empty).
bench_start_pg() {
    local first="$1" extra locale=C
    extra="$(cat)"
    PORT="$first"
    while pg_port_in_use "$PORT"; do
        PORT=$((PORT + 1))
        [ "$PORT" -lt $((first + 100)) ] || die "no free port in $first..$PORT"
    done
    if locale -a 2>/dev/null | grep -qiE '^c\.utf-?8$'; then locale=C.UTF-8; fi

    say "Starting a throwaway PostgreSQL as $BENCH_USER (socket $WORK, port $PORT)"
    as_user "$BINDIR/initdb" -D "$WORK/data" -U "$BENCH_USER" -A trust --no-sync -E UTF8 \
        --locale="$locale" >"$WORK/initdb.log" 2>&1 || { cat "$WORK/initdb.log" >&2; die "initdb failed"; }
    cat >>"$WORK/data/postgresql.conf" <<EOF

# --- $BENCH_NAME ---
listen_addresses = ''
unix_socket_directories = '$WORK'
unix_socket_permissions = 0700
port = $PORT
$extra
EOF
    PG_STARTED=1
    as_user "$BINDIR/pg_ctl" -D "$WORK/data" -l "$WORK/server.log" -w -t 60 start >/dev/null
    as_user psql -X -q -d postgres -c "CREATE DATABASE $DB"
    PG_VERSION_STR="$(psql_q -c 'SELECT version()')"
    info "$PG_VERSION_STR"
}

# Which ratebucket.so does a backend actually map?  (Needs the extension in
# the database given as $1, default $DB; creates the bucket 'libcheck'.)
bench_check_mapped() {
    local mapped
    mapped="$(psql_q -d "${1:-$DB}" -c "SELECT allowed FROM ratebucket.bucket_take('libcheck', 1, 1)" \
                    -c "SELECT DISTINCT m[1] FROM regexp_matches(pg_read_file('/proc/self/maps'), '(/\S*ratebucket\.so)', 'g') AS m" |
              grep ratebucket.so || true)"
    [ "$mapped" = "$LIBFILE" ] || die "backends load '$mapped', not $LIBFILE"
    info "backends load $mapped"
}

# -------------------------------------------------------- machine + load --

bench_machine() {
    CPU_MODEL="$(sed -n 's/^model name[[:space:]]*: *//p' /proc/cpuinfo | head -n1)"
    NPROC="$(nproc)"
    MEM="$(awk '/^MemTotal/ { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo)"
    OS="$( (. /etc/os-release && echo "${PRETTY_NAME:-unknown}") 2>/dev/null || echo unknown)"
    KERNEL="$(uname -r)"
    HYPERVISOR="$(lscpu 2>/dev/null | sed -n 's/^Hypervisor vendor:[[:space:]]*//p')"
    [ -z "$HYPERVISOR" ] || HYPERVISOR=", virtual machine ($HYPERVISOR)"
    FS="$(df -T "$WORK" | awk 'NR == 2 { print $2 " on " $1 }')"
}
machine_line() {
    echo "$NPROC CPUs ($CPU_MODEL)$HYPERVISOR, $MEM RAM, $OS, kernel $KERNEL; data directory on $FS"
}

# CPU time stolen by the hypervisor (other guests on the host): the share of
# all CPU time between two snapshots of /proc/stat, in percent.
cpu_snap() { awk '$1 == "cpu" { t = 0; for (i = 2; i <= 9; i++) t += $i; print t, $9; exit }' /proc/stat; }
steal_pct() {   # "total steal" before, "total steal" after
    awk -v a="$1" -v b="$2" 'BEGIN { split(a, x, " "); split(b, y, " ");
        d = y[1] - x[1]; printf "%.1f", (d > 0) ? 100 * (y[2] - x[2]) / d : 0 }'
}

# Median and spread ((max - min) / median, percent) of numbers on stdin.
median_of() {
    grep -v '^NA$' | sort -g | awk '{ a[NR] = $1 } END {
        if (NR == 0) print "NA";
        else if (NR % 2) print a[(NR + 1) / 2];
        else print (a[NR / 2] + a[NR / 2 + 1]) / 2 }'
}
spread_of() {
    grep -v '^NA$' | sort -g | awk '{ a[NR] = $1 } END {
        if (NR < 2) { print 0; exit }
        m = (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2;
        print (m > 0) ? 100 * (a[NR] - a[1]) / m : 0 }'
}

# ------------------------------------------------------------ WAL per take --

# One psql session, one statement (so one transaction) per take, autocommit.
# synchronous_commit only changes when the WAL is flushed, not what is written;
# it is off here so the loop is quick.  Measured over the loop: WAL bytes
# (pg_current_wal_insert_lsn(): the insert position; pg_current_wal_lsn() is
# the write position, which lags behind by up to wal_writer_delay of WAL when
# synchronous_commit is off — the earlier figures used it), xids (the snapshot's xmax, i.e. the next xid), and
# new row versions: the sum over every table of the database of n_tup_upd +
# n_tup_ins (pg_stat_user_tables; whichever tables the storage uses), of which
# HOT (n_tup_hot_upd).  The session forces its statistics out before reading
# them (pg_stat_force_next_flush(): flushed when the backend next goes idle,
# before it answers the next statement).
# Appends "label|granted|denied|WAL bytes|bytes/take|xids/take|row versions/take|HOT/take"
# to WAL_ROWS.  Needs WAL_TAKES.
WAL_ROWS=()
wal_per() { awk -v x="$1" -v n="$WAL_TAKES" -v f="$2" 'BEGIN { printf f, x / n }'; }
wal_measure() {   # label, setup statement, take statement (must print t or f) [, database]
    local label="$1" setup="$2" take="$3" db="${4:-$DB}" f="$WORK/wal_${1//[^A-Za-z0-9]/_}.sql" out
    local rv="(SELECT coalesce(sum(n_tup_upd + n_tup_ins), 0) FROM pg_stat_user_tables)"
    local hot="(SELECT coalesce(sum(n_tup_hot_upd), 0) FROM pg_stat_user_tables)"
    {
        echo 'SET synchronous_commit = off;'
        echo "$setup"
        echo 'CHECKPOINT;'
        echo 'SELECT pg_stat_force_next_flush();'
        echo "SELECT pg_current_wal_insert_lsn() AS wal_start, pg_snapshot_xmax(pg_current_snapshot()) AS xid_start,"
        echo "       $rv AS rv_start, $hot AS hot_start \\gset"
        awk -v n="$WAL_TAKES" -v t="$take" 'BEGIN { for (i = 0; i < n; i++) print t }'
        echo "SELECT pg_current_wal_insert_lsn() AS wal_end, pg_snapshot_xmax(pg_current_snapshot()) AS xid_end \\gset"
        echo 'SELECT pg_stat_force_next_flush();'
        echo "SELECT 'RESULT', pg_wal_lsn_diff(:'wal_end', :'wal_start'),"
        echo "       :'xid_end'::text::bigint - :'xid_start'::text::bigint,"
        echo "       $rv - :rv_start, $hot - :hot_start;"
    } >"$f"
    give_user "$f"
    out="$(psql_q -d "$db" -f "$f")" || die "WAL measurement $label failed"
    local granted denied bytes xids rows hots
    granted="$(grep -cx 't' <<<"$out" || true)"
    denied="$(grep -cx 'f' <<<"$out" || true)"
    read -r bytes xids rows hots < <(awk -F'|' '$1 == "RESULT" { print $2, $3, $4, $5 }' <<<"$out")
    info "$(printf '%-26s granted %6s  denied %6s  WAL %10s bytes  %8s bytes/take  %5s xids/take  %5s row versions/take (HOT %s)' \
        "$label" "$granted" "$denied" "$bytes" "$(wal_per "$bytes" %.1f)" "$(wal_per "$xids" %.2f)" \
        "$(wal_per "$rows" %.2f)" "$(wal_per "$hots" %.2f)")"
    WAL_ROWS+=("$label|$granted|$denied|$bytes|$(wal_per "$bytes" %.1f)|$(wal_per "$xids" %.2f)|$(wal_per "$rows" %.2f)|$(wal_per "$hots" %.2f)")
}

wal_table() {   # the markdown table of WAL_ROWS
    echo "WAL per take: $WAL_TAKES takes in one psql session, one statement (transaction) each;"
    echo "bytes from pg_current_wal_insert_lsn(), xids from the next-xid counter (both cluster-wide);"
    echo "row versions: n_tup_upd + n_tup_ins summed over the database's tables"
    echo "(pg_stat_user_tables), of which HOT: n_tup_hot_upd."
    echo
    echo "| takes | granted | denied | WAL bytes | bytes / take | xids / take | row versions / take | of which HOT |"
    echo "|---|---:|---:|---:|---:|---:|---:|---:|"
    local w
    for w in "${WAL_ROWS[@]}"; do echo "| ${w//|/ | } |"; done
}
