#!/usr/bin/env bash
# The whole test suite (run scripts/setup.sh once first): everything on numpy 2.x, then the
# dequantization tests again on numpy 1.26, whose float promotion rules differ (docs/interfaces.md).
#   sudo bash scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -gt 0 ]; then  # arguments go to pytest and run only those tests, on numpy 2.x
    exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
fi
# Two modules run in pytest processes of their own. tests/test_clients_transformers.py calls transformers'
# from_pretrained from four threads at once, which leaves transformers 5.x's process state broken: a later
# load in the same process can leave a tied weight on the meta device (gemma3's lm_head), and its logits are
# then garbage (seen as tests/test_hf_folder.py's gemma3 logits differing on either side, docs/hf.md). The
# Redis Cluster tests' lease and dead-node counts failed now and then in whole-suite processes only
# (docs/caches.md); why is not known yet.
OWN_PROCESS=(tests/test_clients_transformers.py tests/test_tiers_redis_cluster.py)
.venv/bin/python -m pytest -q -p no:cacheprovider "${OWN_PROCESS[@]/#/--ignore=}"
for module in "${OWN_PROCESS[@]}"; do
    .venv/bin/python -m pytest -q -p no:cacheprovider "$module"
done
echo "== dequantization tests on numpy $(.venv-np1/bin/python -c 'import numpy; print(numpy.__version__)')"
.venv-np1/bin/python -m pytest -q -p no:cacheprovider tests/test_quant_*.py
