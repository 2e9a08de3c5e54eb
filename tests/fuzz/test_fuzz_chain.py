"""Whole-chain fuzzing (issue 16): random small models on random clusters, every plan and
baseline run in the in-process executor against one device, the plan's invariants checked
(see :mod:`tests.fuzz.chain`).

* the default run: a handful of cases, seconds;
* ``-m slow``: the big count with the fixed seed (CI), and a few plans under torchrun/gloo with
  ``--verify``;
* ``make fuzz``: the big count again from a fresh seed (``FUZZ_SEED``, ``FUZZ_CASES``).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from hypothesis import event, given

from tests.fuzz.chain import check_case, replicated_bytes
from tests.fuzz.microbatch import check_microbatching
from tests.fuzz.models import MICRO_HEADS, Block, ClusterSpec, ModelSpec, cluster_specs, model_specs
from tests.fuzz.settings import cases, fuzz

REPO = Path(__file__).resolve().parents[2]


def _record(outcome) -> None:
    event(f"plan: {outcome.plan_name or 'none fits'}")
    if outcome.empty_pieces:
        event("some rank holds an empty piece")


@fuzz(cases("FUZZ_QUICK_CASES", 3))
@given(model_specs(max_blocks=2), cluster_specs(max_devices=5))
def test_whole_chain_quick(model_spec, cluster_spec):
    # Determinism (a second synthesis) is left to the slow pass: it doubles a case's time.
    _record(check_case(model_spec, cluster_spec, determinism=False))


@pytest.mark.slow
@fuzz(cases("FUZZ_CASES", 2000))
@given(model_specs(), cluster_specs())
def test_whole_chain(model_spec, cluster_spec):
    _record(check_case(model_spec, cluster_spec))


# ---- micro-batches add up to the whole batch, or are refused (issue 24) --------------------------

@fuzz(cases("FUZZ_QUICK_CASES", 3) * 4)
@given(model_specs(max_blocks=3, extra_heads=MICRO_HEADS))
def test_micro_batches_add_up_or_are_refused_quick(model_spec):
    event(f"micro-batching: {check_microbatching(model_spec)}")


@pytest.mark.slow
@fuzz(cases("FUZZ_MICRO_CASES", 400))
@given(model_specs(extra_heads=MICRO_HEADS))
def test_micro_batches_add_up_or_are_refused(model_spec):
    event(f"micro-batching: {check_microbatching(model_spec)}")


# ---- a few found plans, for real: emitted, run under torchrun on gloo with --verify -------------

# Chosen by hand to span the generator: attention with a tied embedding head, merged views with a
# weight used twice on two nodes with a 20x speed spread and tight memory, a convolution over the
# sequence with a sequence mean; 3 to 5 ranks.
TORCHRUN_CASES = [
    (ModelSpec(batch=5, hidden=6, seq=3, tokens=True, vocab=7,
               blocks=(Block("attention", size=2, variant="causal"), Block("layernorm")), head="ce_tied"),
     ClusterSpec(speeds=(1.0, 5.0, 2.0), memory=(4.0, 4.0, 4.0))),
    (ModelSpec(batch=7, hidden=12, seq=2, blocks=(Block("merge", size=5), Block("twice"), Block("act", variant="gelu")),
               head="mse"),
     ClusterSpec(speeds=(1.0, 1.0, 20.0, 4.47), memory=(0.6, 0.6, 2.0, 2.0), nodes=(2, 2))),
    (ModelSpec(batch=4, hidden=11, seq=5, tokens=True, vocab=11,
               blocks=(Block("conv", size=3), Block("reduce", variant="seq_mean"), Block("mlp_residual", size=7)),
               head="ce"),
     ClusterSpec(speeds=(2.0, 1.0, 1.0, 1.0, 2.0), memory=(1.5, 1.5, 1.5, 1.5, 1.5))),
]


def model_file(tmp_path: Path, spec: ModelSpec) -> Path:
    """A model file (design.md section 3) for a fuzz model: the emitted program imports it."""
    path = tmp_path / "fuzz_model.py"
    path.write_text(textwrap.dedent(f"""\
        import sys
        sys.path.insert(0, {str(REPO)!r})
        from tests.fuzz.models import Block, ModelSpec  # noqa: E402

        SPEC = {spec!r}


        def model():
            return SPEC.build()[0]


        def inputs():
            return SPEC.build()[1]
        """))
    return path


@pytest.mark.slow
@pytest.mark.parametrize("case", range(len(TORCHRUN_CASES)))
def test_found_plans_verify_under_torchrun(case, tmp_path):
    import hapc
    from costmodel.cluster import load_cluster
    from hapc.codegen.emitter import emit

    from tests.runs import torchrun, verify_line

    spec, cluster_spec = TORCHRUN_CASES[case]
    check_case(spec, cluster_spec, determinism=False)           # in process first
    model, inputs = spec.build()
    traced = hapc.trace(model, inputs)
    cluster = load_cluster(cluster_spec.to_dict(replicated_bytes(traced)))
    plan = hapc.synthesize(traced, None, cluster)
    path = Path(emit(plan.program, str(model_file(tmp_path, spec)), str(tmp_path / "out"), cluster=cluster,
                     constants=traced.constants))
    proc = torchrun(path, cluster.world, "--verify", "--steps", "1")
    line = verify_line(proc)
    assert line.startswith("verify: ok") and proc.returncode == 0, line + proc.stderr[-3000:]


def test_torchrun_cases_are_valid_specs():
    """The kept cases still build (the slow test above would fail late otherwise)."""
    for spec, cluster in TORCHRUN_CASES:
        assert spec.build()[0] is not None and cluster.world == len(cluster.memory)

