#!/usr/bin/env bash
# The whole test suite (run scripts/setup.sh once first): everything on numpy 2.x, then the
# dequantization tests again on numpy 1.26, whose float promotion rules differ (docs/interfaces.md).
#   sudo bash scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -gt 0 ]; then  # arguments go to pytest and run only those tests, on numpy 2.x
    exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
fi
# Two modules run in pytest processes of their own: in whole-suite processes (never alone) they failed now
# and then — transformers' gemma3 logits differing at the first positions on one side or the other, and the
# Redis Cluster tests' lease and dead-node counts — which is being investigated (see docs/hf.md, docs/caches.md).
OWN_PROCESS=(tests/test_hf_folder.py tests/test_tiers_redis_cluster.py)
.venv/bin/python -m pytest -q -p no:cacheprovider "${OWN_PROCESS[@]/#/--ignore=}"
for module in "${OWN_PROCESS[@]}"; do
    .venv/bin/python -m pytest -q -p no:cacheprovider "$module"
done
echo "== dequantization tests on numpy $(.venv-np1/bin/python -c 'import numpy; print(numpy.__version__)')"
.venv-np1/bin/python -m pytest -q -p no:cacheprovider tests/test_quant_*.py
