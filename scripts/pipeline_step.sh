#!/usr/bin/env bash
# Measured CPU step time of a pipelined plan against the one-stage plan: the example GPT
# (8 layers) on configs/clusters/cpu-2nodes-2x2.yaml, 4 gloo ranks on this host, two
# alternating rounds. Run from the project root: scripts/pipeline_step.sh
# One host has no slow link between its "nodes", so this shows the pipeline's runtime overhead
# (p2p, bubble), not the network saving the plan is chosen for.
set -eu
export OMP_NUM_THREADS=1
PY=.venv/bin; out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
M="--set layers=8 --set hidden=256 --set heads=4 --set seq=64 --set vocab=2048 --set batch=16 --set dropout=0.0"
C=configs/clusters/cpu-2nodes-2x2.yaml
$PY/hapc compile configs/models/gpt.py --cluster $C $M -o "$out/1d" -q | grep -E "predicted time"
$PY/hapc compile configs/models/gpt.py --cluster $C $M --stages 2 -o "$out/pp" -q | grep -E "predicted time|^pipeline:"
port() { $PY/python -c "import socket; s=socket.socket(); s.bind(('127.0.0.1',0)); print(s.getsockname()[1])"; }
for round in 1 2; do
  for p in 1d pp; do
    echo -n "$p round $round: "
    $PY/torchrun --nproc_per_node=4 --master_port="$(port)" "$out/$p/program.py" --steps 6 2>&1 | grep "median step time"
  done
done
