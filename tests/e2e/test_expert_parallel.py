"""Expert parallelism on Hugging Face Mixtral, unmodified: each rank holds some experts and
multiplies only the tokens routed to them (``ExpertRows`` from the up projection to the down
projection, a ``Partial`` after it).

* in process, float64: the expert-parallel program against one device, on 2-10 ranks (more
  ranks than experts too), uneven, and for five more families (tests/e2e/families/moe_families.py);
* the search picks it for a Mixtral of a quarter of 8x7B's width on 4 and 8 GPUs;
* slow: the emitted program under torchrun on 3 uneven gloo ranks prints ``verify: ok``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from hapc.ir.layout import ExpertRows, Replicate
from hapc.ir.program import Compute

pytest.importorskip("transformers")

REPO = Path(__file__).resolve().parents[2]
FAMILIES = REPO / "tests" / "e2e" / "families"


@pytest.fixture(scope="module")
def mixtral():
    sys.path.insert(0, str(FAMILIES))
    import mixtral as module

    import hapc

    torch.manual_seed(0)
    return module, hapc.trace(module.model(layers=2), module.inputs())


def expert_parallel_program(graph, shares):
    """Greedy propagation told to take every expert-row strategy it is offered (the search takes
    them only where the cost model says they win, which a tiny model never does)."""
    from synth.builder import greedy_score, propagate

    def score(node, strategy, builder):
        starts = (strategy.local == "grouped_mm_experts" and isinstance(strategy.inputs[0], Replicate)) \
            or strategy.local == "index_expert_rows"
        ends = strategy.local == "grouped_mm_experts_padded" and isinstance(strategy.inputs[0], ExpertRows)
        keeps = any(isinstance(x, ExpertRows) for x in strategy.inputs)
        return greedy_score(node, strategy, builder) - (1e4 if starts or ends or keeps else 0.0)

    return propagate(graph, shares, score=score)


def _expert_steps(program) -> list[str]:
    return [s.strategy.local for s in program.steps
            if isinstance(s, Compute) and s.strategy.local and s.strategy.local.startswith("grouped_mm_experts")]


@pytest.mark.parametrize("shares", [(0.5, 0.3, 0.2), (0.25,) * 4, (0.4, 0.6), (0.1,) * 10], ids=str)
def test_expert_parallel_mixtral_matches_one_device(mixtral, shares):
    from hapc.codegen.executor import replicated_program, run

    module, traced = mixtral
    program = expert_parallel_program(traced.graph, shares)
    assert _expert_steps(program) == ["grouped_mm_experts", "grouped_mm_experts_padded"] * 2
    got = run(program, traced, module.inputs(), dtype=torch.float64)
    want = run(replicated_program(traced.graph), traced, module.inputs(), dtype=torch.float64)
    assert abs(got.loss.item() - want.loss.item()) < 1e-10
    assert max((got.grads[k] - want.grads[k]).abs().max().item() for k in want.grads) < 1e-10


@pytest.mark.parametrize("family", ["olmoe", "qwen2_moe", "granitemoe", "deepseek_v3", "gpt_oss"])
def test_every_grouped_matmul_family_is_expert_parallel_and_exact(family):
    """Shared experts, latent attention, expert biases looked up by the sorted expert ids and a
    clamped gated activation (GPT-OSS) all stay exact on 3 uneven ranks."""
    sys.path.insert(0, str(FAMILIES))
    import moe_families

    import hapc
    from hapc.codegen.executor import replicated_program, run

    torch.manual_seed(0)
    traced = hapc.trace(moe_families.model(family), moe_families.inputs(family))
    program = expert_parallel_program(traced.graph, (0.5, 0.3, 0.2))
    assert _expert_steps(program) == ["grouped_mm_experts", "grouped_mm_experts_padded"]
    got = run(program, traced, moe_families.inputs(family), dtype=torch.float64)
    want = run(replicated_program(traced.graph), traced, moe_families.inputs(family), dtype=torch.float64)
    assert abs(got.loss.item() - want.loss.item()) < 1e-10
    assert max((got.grads[k] - want.grads[k]).abs().max().item() for k in want.grads) < 1e-10


@pytest.mark.parametrize("cluster", ["a100x4", "a100x4-v100x4-pcie"])
def test_the_search_shards_a_wide_mixtral_by_expert(cluster, tmp_path):
    """One layer of 8 experts (hidden 1024, MLP 3584), 8 x 1024 tokens, bf16: holding whole
    experts beats splitting every expert (whose gated activation then needs a reduce-scatter
    of [tokens x 2, 3584]) and replicating them (8 x 22 MB of gradients to reduce)."""
    import yaml

    import hapc
    from costmodel.cluster import load_cluster

    path = REPO / "configs" / "clusters" / f"{cluster}.yaml"
    if not path.exists():
        path = tmp_path / "a100x4.yaml"
        path.write_text(yaml.safe_dump({"name": cluster, "nodes": [
            {"devices": [{"type": "A100-80GB", "count": 4}], "intra_link": "nvlink3"}]}))
    plan = hapc.synthesize(str(REPO / "configs" / "models" / "hf_mixtral.py"), None, load_cluster(str(path)),
                           model_kwargs={"layers": 1}, precision="bf16", trace_cache=False)
    assert _expert_steps(plan.program) == ["grouped_mm_experts", "grouped_mm_experts_padded"]
    assert plan.cost < min(plan.baselines[b] for b in ("dp-even", "dp-flops", "zero3")) / 2
    from hapc.report.summary import summary_text

    assert "expert parallel: 2 of 2 grouped matmuls hold their experts sharded" in summary_text(plan)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["mixtral", "gpt_oss"])
def test_expert_parallel_program_verifies_on_three_uneven_gloo_ranks(family, tmp_path):
    from costmodel.cluster import load_cluster
    import hapc
    from hapc.codegen import emit
    from tests.e2e.test_families_encdec import UNEVEN
    from tests.runs import torchrun, verify_line

    sys.path.insert(0, str(FAMILIES))
    import mixtral
    import moe_families

    module, kwargs = (mixtral, {"layers": 2}) if family == "mixtral" else (moe_families, {"family": family})
    torch.manual_seed(0)
    traced = hapc.trace(module.model(**kwargs), module.inputs(**({} if family == "mixtral" else kwargs)))
    cluster = load_cluster(UNEVEN)
    program = expert_parallel_program(traced.graph, tuple(cluster.flops_shares()))
    path = emit(program, str(FAMILIES / f"{module.__name__}.py"), str(tmp_path), model_kwargs=kwargs,
                cluster=cluster, constants=traced.constants)
    assert "L.grouped_mm_experts(" in Path(path).read_text()
    proc = torchrun(Path(path), 3, "--verify", "--steps", "2", timeout=600)
    line = verify_line(proc)
    assert line.startswith("verify: ok") and proc.returncode == 0, line + proc.stderr[-3000:]
