#!/usr/bin/env bash
# The GPU checks and their figures, in one command (see README.md here).
set -uo pipefail
cd "$(dirname "$0")/../.."
python setup.py build_ext --inplace >/dev/null 2>&1 || echo "C extension not built: the native runs are skipped"
python -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda, 'available', torch.cuda.is_available(), torch.cuda.get_device_name() if torch.cuda.is_available() else '')"
PYTHONPATH=. python -m pytest tests/gpu -v -s -rs -p no:cacheprovider "$@"; rc=$?
PYTHONPATH=. python benchmarks/overhead.py --rounds 5 --number 20000 --memory-calls 0 | sed -n '1p;/torch integration/,$p'
exit $rc
