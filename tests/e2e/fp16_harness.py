"""Run an emitted fp16 program under torchrun with its loss scaling observed and, on request,
an overflow injected: ``HARNESS_PROGRAM=PROGRAM.py python fp16_harness.py [program args]``
(under torchrun), with

* ``HARNESS_INF="RANK:STEP"``: before that step's verdict, rank RANK puts an inf into its first
  gradient (an overflow only that rank sees: the other ranks must skip the step too);
* ``HARNESS_SCALING="key=value,..."``: LOSS_SCALING overrides (``growth_interval=2``).

Every rank prints ``verdict rank=R step=K skipped=0|1 scale=S next=N``, so a test can hold the
ranks' decisions side by side. Not a test module: tests/e2e/test_fp16_run.py launches it.
"""

from __future__ import annotations

import importlib.util
import os
import sys

program_path = os.environ["HARNESS_PROGRAM"]
spec = importlib.util.spec_from_file_location("program_under_test", program_path)
program = importlib.util.module_from_spec(spec)
spec.loader.exec_module(program)

if os.environ.get("HARNESS_SCALING"):
    overrides = dict(kv.split("=") for kv in os.environ["HARNESS_SCALING"].split(","))
    program.LOSS_SCALING = {**program.LOSS_SCALING, **{k: float(v) for k, v in overrides.items()}}
inject = tuple(int(x) for x in os.environ["HARNESS_INF"].split(":")) if os.environ.get("HARNESS_INF") else None
finish = program.S.LossScaler.finish


def observed_finish(self, params):
    rank = int(os.environ.get("RANK", "0"))
    step = self.harness_calls = getattr(self, "harness_calls", 0) + 1
    grads = [p for p in params if p.grad is not None]
    if inject is not None and rank == inject[0] and step == inject[1] and grads:
        grads[0].grad.view(-1)[0] = float("inf")
    verdict = finish(self, params)
    print(f"verdict rank={rank} step={step} skipped={int(verdict.skipped)} scale={verdict.scale:g} "
          f"next={verdict.next_scale:g}", flush=True)
    return verdict


program.S.LossScaler.finish = observed_finish
status = program.main(sys.argv[1:])
sys.stdout.flush()
os._exit(status)
