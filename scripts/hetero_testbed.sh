#!/usr/bin/env bash
# Heterogeneous CPU testbed: one fast device and two slow ones made of two CPU cores.
#
# Rank 0 runs alone on core 0; ranks 1 and 2 share core 1, so each gets half a core. The
# script profiles the three ranks pinned that way (`hapc profile --affinity 0,1,1`, written to
# OUT/cluster.yaml), plans the model for that cluster (even data parallel and the synthesized
# plan), runs both programs pinned the same way in alternating rounds, and prints predicted and
# measured step times and the measured speed-up.
#
#   scripts/hetero_testbed.sh                      # the default MLP, out/testbed/
#   scripts/hetero_testbed.sh --model configs/models/gpt.py --set layers=2 --set hidden=256
#   AFFINITY=0,0,1 scripts/hetero_testbed.sh       # another split of the cores
#   scripts/hetero_testbed.sh --cluster out/testbed/cluster.yaml   # reuse a profile
#
# Needs Linux (sched_setaffinity) and at least 2 cores. Other work on the machine moves the
# absolute times; the interleaved rounds keep the speed-up comparable.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY=python3
exec "$PY" -m profiler.testbed --affinity "${AFFINITY:-0,1,1}" "$@"
