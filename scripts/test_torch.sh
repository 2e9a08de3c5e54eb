#!/usr/bin/env bash
# Run the torch-sensitive tests (tracer, rule checker, executor, emitted programs) against
# another torch release, in a venv of its own: `make test-torch TORCH_SPEC=torch==2.14.1`.
#
# Why a venv of its own: the main .venv carries the torch that development uses; a second
# torch must not be mixed into it, and the main one must not leak into this one (no
# --system-site-packages; checked below). The venv is kept between runs (.venv-torch-<spec>),
# so only the first run pays for the download; pip's wheel cache serves later rebuilds.
#
# Environment: PYTHON (interpreter for the venv, default python3), TEST_TORCH_TESTS (override
# the test selection), TEST_TORCH_SLOW=0 to skip the multi-process (torchrun) tests.
set -euo pipefail
cd "$(dirname "$0")/.."

spec="${1:?usage: scripts/test_torch.sh TORCH_SPEC (e.g. torch==2.14.1)}"
python="${PYTHON:-python3}"
name="$(printf '%s' "$spec" | sed -e 's/^torch//' -e 's/[^A-Za-z0-9.+-]/_/g' -e 's/^_*//')"
venv=".venv-torch-${name:-latest}"
py="$venv/bin/python"

if [ ! -f "$venv/.installed" ]; then
    echo "test-torch: building $venv for '$spec'" >&2
    start=$(date +%s)
    rm -rf "$venv"
    "$python" -m venv "$venv"
    "$py" -m pip install -q "$spec"
    # The project's other dependencies, read from pyproject.toml (torch left as installed above).
    deps=$("$py" - <<'PY'
import tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
wanted = project["dependencies"] + project["optional-dependencies"]["test"]
print(" ".join(d for d in wanted if not d.replace(" ", "").startswith("torch")))
PY
)
    # shellcheck disable=SC2086
    "$py" -m pip install -q $deps
    touch "$venv/.installed"
    echo "test-torch: built $venv in $(( $(date +%s) - start )) s" >&2
fi

# The torch that runs must be the one asked for, from this venv (not the main one).
"$py" - "$venv" <<'PY'
import sys
from pathlib import Path

import torch

venv = Path(sys.argv[1]).resolve()
where = Path(torch.__file__).resolve()
if venv not in where.parents:
    sys.exit(f"test-torch: torch comes from {where}, not from {venv}")
print(f"test-torch: torch {torch.__version__} from {where.parent}")
PY

tests="${TEST_TORCH_TESTS:-tests/frontend/test_models.py tests/rules/test_rules_check.py tests/rules/test_rules_core.py \
tests/rules/test_rules_view.py tests/rules/test_rules_conv_moe.py tests/codegen/test_executor.py tests/codegen/test_codegen.py}"
start=$(date +%s)
status=0
# shellcheck disable=SC2086
PYTHONPATH="$PWD" PATH="$PWD/$venv/bin:$PATH" "$py" -m pytest -q -p no:cacheprovider -m "not slow" $tests || status=$?
if [ "${TEST_TORCH_SLOW:-1}" != 0 ]; then
    # Emitted programs under torchrun: every example model and collective variant, and the
    # synthesized plans of the Hugging Face families whose tracing differs most between torch
    # releases (rotary embeddings under autocast, sliding-window masks); the main test pass
    # runs the other families.
    PYTHONPATH="$PWD" PATH="$PWD/$venv/bin:$PATH" "$py" -m pytest -q -p no:cacheprovider -m slow \
        tests/e2e/test_torchrun.py || status=$?
    PYTHONPATH="$PWD" PATH="$PWD/$venv/bin:$PATH" "$py" -m pytest -q -p no:cacheprovider -m slow \
        tests/e2e/test_families.py -k "gloo and synth and (llama or mistral or bert or vit)" || status=$?
fi
echo "test-torch: $spec: tests took $(( $(date +%s) - start )) s, exit $status" >&2
exit $status
