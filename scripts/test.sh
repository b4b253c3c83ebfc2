#!/usr/bin/env bash
# The whole test suite (run scripts/setup.sh once first), in phases: everything on numpy 2.x (two modules in
# pytest processes of their own, see OWN_PROCESS), then the dequantization tests again on numpy 1.26, whose
# float promotion rules differ (docs/interfaces.md). Every phase runs whatever the ones before it did; the
# end is one summary (passed, failed and skipped per phase, why each skip, which tests failed) whose last
# line is the totals alone, "N passed, N failed, N skipped". Exit status 1 when a phase failed, else 0; a
# phase that collects no test (pytest's exit 5) is shown as such and is not a failure. Ctrl-C (SIGINT) ends
# the run after the phase it stopped, with the summary of what ran (pytest's exit 2 alone, which errors while
# collecting give too, does not).
#   sudo bash scripts/test.sh
#   bash scripts/test.sh tests/fuse/test_mount.py -k name     # arguments go to pytest on numpy 2.x: only those tests
# CKPTFS_TEST_DIR (default tests) is the folder the phases take their modules from.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTEST=(-q -rfEs -p no:cacheprovider)
if [ $# -gt 0 ]; then
    exec .venv/bin/python -m pytest "${PYTEST[@]}" "$@"
fi
TESTS=${CKPTFS_TEST_DIR:-tests}
REPORTS=$(mktemp -d /tmp/ckptfs-test-reports.XXXXXX)
trap 'rm -rf "$REPORTS"' EXIT
SUMMARY_ARGS=()
INTERRUPTED=0
trap 'INTERRUPTED=1' INT  # run once the phase that got it has ended

phase() {  # phase NAME PYTHON PYTEST-ARGS...: one pytest run, its JUnit XML report and exit status kept
    local name=$1 python=$2 rc
    shift 2
    local xml="$REPORTS/${#SUMMARY_ARGS[@]}.xml"
    if [ "$INTERRUPTED" = 1 ]; then
        SUMMARY_ARGS+=("$name" not-run "$xml")
        return
    fi
    printf '\n== %s\n' "$name"
    if [ -x "$python" ]; then
        "$python" -m pytest "${PYTEST[@]}" --junitxml="$xml" "$@"
        rc=$?
    else
        echo "test.sh: $python is missing: run scripts/setup.sh first" >&2
        rc=127
    fi
    SUMMARY_ARGS+=("$name" "$rc" "$xml")
}

# Two modules run in pytest processes of their own. test_clients_transformers.py calls transformers'
# from_pretrained from four threads at once, which leaves transformers 5.x's process state broken: a later
# load in the same process can leave a tied weight on the meta device (gemma3's lm_head), and its logits are
# then garbage (seen as tests/hffolder/test_hf_folder.py's gemma3 logits differing on either side, docs/hf.md). The
# Redis Cluster tests' lease and dead-node counts failed now and then in whole-suite processes only;
# why is not known yet.
OWN_PROCESS=("$TESTS/clients/test_clients_transformers.py" "$TESTS/cache/test_tiers_redis_cluster.py")
phase "numpy 2 (all but ${OWN_PROCESS[*]##*/})" .venv/bin/python "$TESTS" "${OWN_PROCESS[@]/#/--ignore=}"
for module in "${OWN_PROCESS[@]}"; do
    phase "numpy 2, ${module##*/}" .venv/bin/python "$module"
done
NP1=$(.venv-np1/bin/python -c 'import numpy; print(numpy.__version__)' 2>/dev/null) || NP1="1.26"
phase "numpy $NP1, dequantization tests" .venv-np1/bin/python "$TESTS"/quant/test_*.py

printf '\n== summary\n'
python3 scripts/test_summary.py "${SUMMARY_ARGS[@]}"
