#!/usr/bin/env bash
# The whole test suite (run scripts/setup.sh once first): everything on numpy 2.x, then the
# dequantization tests again on numpy 1.26, whose float promotion rules differ (docs/interfaces.md).
#   sudo bash scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/python -m pytest -q -p no:cacheprovider "$@"
if [ $# -eq 0 ]; then
    echo "== dequantization tests on numpy $(.venv-np1/bin/python -c 'import numpy; print(numpy.__version__)')"
    .venv-np1/bin/python -m pytest -q -p no:cacheprovider tests/test_quant_*.py
fi
