#!/usr/bin/env bash
# Model-checks shoal's protocols with Spin: the cache coherency protocol
# (model/coherence.pml) and the fast path's get without a round trip
# (model/fast_reads.pml) and its seals that do not wait (model/fast_writes.pml).
# Each must verify with no errors, and every broken
# variant must be caught with a counterexample. Exits non-zero otherwise.
#
# Needs spin and gcc on PATH (installs nothing). On Debian/Ubuntu:
#     apt-get install -y spin gcc
# Works in a temporary directory, so no pan files land in the repository.
# Set KEEP=1 to keep it (trails for `spin -t -p` included).
set -euo pipefail
cd "$(dirname "$0")/.."
MODELS="$PWD/model"

missing=0
for tool in spin gcc; do
    if ! command -v "$tool" >/dev/null; then
        echo "check-model: $tool not found; install it with: apt-get install -y spin gcc" >&2
        missing=1
    fi
done
[ "$missing" = 0 ] || exit 2

WORK=$(mktemp -d "${TMPDIR:-/tmp}/shoal-model.XXXXXX")
if [ "${KEEP:-0}" = 1 ]; then
    echo "check-model: keeping $WORK"
else
    trap 'rm -rf "$WORK"' EXIT
fi

# verify NAME [spin -D flags...]: builds and runs an exhaustive safety search
# of $MODEL in its own directory and prints "<errors> <states stored> <seconds>".
MODEL=coherence.pml
verify() {
    local name=$1
    shift
    local dir="$WORK/${MODEL%.pml}-$name"
    mkdir -p "$dir"
    cp "$MODELS/$MODEL" "$dir/"
    (
        cd "$dir"
        local start end
        start=$(date +%s%N)
        spin "$@" -a "$MODEL" >spin.log 2>&1 || { cat spin.log >&2; exit 3; }
        # pan.c is generated code; its warnings are Spin's, not ours.
        gcc -O2 -DSAFETY -w -o pan pan.c >gcc.log 2>&1 || { cat gcc.log >&2; exit 3; }
        ./pan >pan.log 2>&1 || true
        end=$(date +%s%N)
        if grep -q "max search depth too small" pan.log; then
            echo "check-model: $name: search was cut off (raise -m)" >&2
            exit 3
        fi
        local errors states
        errors=$(sed -n 's/.*errors: \([0-9][0-9]*\).*/\1/p' pan.log | head -n1)
        states=$(sed -n 's/^ *\([0-9][0-9]*\) states, stored.*/\1/p' pan.log | head -n1)
        if [ -z "$errors" ]; then
            cat pan.log >&2
            exit 3
        fi
        printf '%s %s %s\n' "$errors" "${states:-?}" \
            "$(awk -v ns=$((end - start)) 'BEGIN { printf "%.1f", ns / 1e9 }')"
    )
}

status=0
report() { printf 'check-model: %-45s %s\n' "$1" "$2"; }

# The protocol: exhaustive search, no assertion violated, no deadlock.
read -r errors states secs < <(verify protocol) || exit 3
if [ "$errors" = 0 ]; then
    report "protocol" "verified: $states states, ${secs}s"
else
    report "protocol" "FAILED: $errors errors (run with KEEP=1, then spin -t -p)"
    status=1
fi

# Each broken variant must be caught, with the reader-never-dirty check on
# and with only the data property checked.
for variant in NO_FLUSH NO_INVALIDATE NO_OWNER_INVALIDATE NO_ABORT_FLUSH SEAL_BEFORE_FLUSH; do
    for mode in full data-only; do
        flags=("-D$variant")
        [ "$mode" = data-only ] && flags+=(-DDATA_ASSERT_ONLY)
        read -r errors states secs < <(verify "$variant-$mode" "${flags[@]}") || exit 3
        if [ "$errors" -ge 1 ]; then
            report "$variant ($mode)" "counterexample found as expected (${secs}s)"
        else
            report "$variant ($mode)" "NOT CAUGHT: verified with $states states"
            status=1
        fi
    done
done

# The fast path: a reader holding an object never has its memory freed; each
# broken variant (no version re-check, counts read before unpublishing, no
# keeping) must be caught.
MODEL=fast_reads.pml
read -r errors states secs < <(verify protocol) || exit 3
if [ "$errors" = 0 ]; then
    report "fast reads" "verified: $states states, ${secs}s"
else
    report "fast reads" "FAILED: $errors errors (run with KEEP=1, then spin -t -p)"
    status=1
fi
for variant in NO_RECHECK LOOK_BEFORE_UNPUBLISH NO_KEEP; do
    read -r errors states secs < <(verify "$variant" "-D$variant") || exit 3
    if [ "$errors" -ge 1 ]; then
        report "fast reads $variant" "counterexample found as expected (${secs}s)"
    else
        report "fast reads $variant" "NOT CAUGHT: verified with $states states"
        status=1
    fi
done

# Seals that do not wait (model/fast_writes.pml): after seal returns every
# get finds the object, after delete returns none does, and no published
# record is left behind by a sleeping poller; each broken variant (a request
# answered before the records are applied, the poller's look before it says
# it sleeps) must be caught.
MODEL=fast_writes.pml
read -r errors states secs < <(verify protocol) || exit 3
if [ "$errors" = 0 ]; then
    report "fast writes" "verified: $states states, ${secs}s"
else
    report "fast writes" "FAILED: $errors errors (run with KEEP=1, then spin -t -p)"
    status=1
fi
for variant in NO_APPLY_BEFORE_REQUEST LOOK_BEFORE_ASLEEP; do
    read -r errors states secs < <(verify "$variant" "-D$variant") || exit 3
    if [ "$errors" -ge 1 ]; then
        report "fast writes $variant" "counterexample found as expected (${secs}s)"
    else
        report "fast writes $variant" "NOT CAUGHT: verified with $states states"
        status=1
    fi
done

if [ "$status" = 0 ]; then
    echo "check-model: ok"
else
    echo "check-model: FAILED" >&2
fi
exit "$status"
