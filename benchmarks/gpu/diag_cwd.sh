#!/usr/bin/env bash
# Does a process find cuDNN's runtime-compiled attention kernels of an earlier process only when
# both ran in the same working directory? (issue 31; ~1.5 min on 1 GPU)
#
#   bash benchmarks/gpu/diag_cwd.sh      # one JSON line per process (benchmarks/gpu/sdpa_first_call.py)
set -u -o pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PY=${PYTHON:-python3}
S="$REPO/benchmarks/gpu/sdpa_first_call.py"
export CUDA_VISIBLE_DEVICES=0 PYTHONPYCACHEPREFIX=${PYTHONPYCACHEPREFIX:-/tmp/pycache-cwd}
unset PYTHONDONTWRITEBYTECODE  # the image sets it: every import of torch would compile from source
mkdir -p /tmp/cwd-a /tmp/cwd-b /tmp/cwd-c
echo "# same folder twice, then another folder twice, then the first again"
for d in a a b b a; do (cd /tmp/cwd-$d && $PY "$S"); done
echo "# folder a, other arguments; folder a, another environment variable"
(cd /tmp/cwd-a && $PY "$S" --other-args x)
(cd /tmp/cwd-a && SOME_VAR=1 $PY "$S")
echo "# a new folder c, entered through a symlink d -> c, then c itself"
ln -sfn /tmp/cwd-c /tmp/cwd-d
(cd /tmp/cwd-d && $PY "$S")
(cd /tmp/cwd-c && $PY "$S")
echo "# one link, L -> e1 then L -> e2 (PWD=L both times): is the link's path the key, or the folder behind it?"
mkdir -p /tmp/cwd-e1 /tmp/cwd-e2
ln -sfn /tmp/cwd-e1 /tmp/cwd-L
(cd /tmp/cwd-L && $PY "$S")
ln -sfn /tmp/cwd-e2 /tmp/cwd-L
(cd /tmp/cwd-L && $PY "$S")
echo "# started in a new folder f by a parent elsewhere (PWD is the parent's, not f's): the physical folder is the key"
mkdir -p /tmp/cwd-f /tmp/cwd-g
(cd /tmp/cwd-a && $PY -c "import subprocess, sys; subprocess.run([sys.executable, '$S'], cwd='/tmp/cwd-f')")
(cd /tmp/cwd-a && $PY -c "import subprocess, sys; subprocess.run([sys.executable, '$S'], cwd='/tmp/cwd-g')")
