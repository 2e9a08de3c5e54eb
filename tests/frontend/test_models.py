"""The example model files (configs/models/*.py) and the tracer on them and on real HF models.

For each model at its ``SMALL`` size: the model-file contract holds, ``hapc.trace`` captures it,
and running the traced graph through the in-process executor (replicated, float64) gives the
same loss and parameter gradients as calling the module itself. That validates the tracer:
every later stage starts from this graph, so a node it drops or mis-wires shows up here.
"""

from __future__ import annotations

import copy
import functools
import math

import pytest
import torch
import torch.nn.functional as F

import hapc
from hapc.codegen.executor import replicated_program, run

MODELS = ["mlp", "gpt", "bert", "vit", "vgg", "moe"]


@pytest.fixture(scope="session")
def small(load_model):
    """``small(name)`` -> (traced SMALL model, its inputs), traced once per session: tracing
    dominates this file's run time."""

    @functools.cache
    def traced(name: str):
        module = load_model(name)
        torch.manual_seed(0)
        model = module.model(**module.SMALL)
        inputs = tuple(module.inputs(**module.SMALL))
        return hapc.trace(model, inputs), inputs

    return traced


def module_reference(model: torch.nn.Module, inputs) -> tuple[torch.Tensor, torch.nn.Module]:
    """Loss and gradients of the module itself, on a float64 copy."""
    ref = copy.deepcopy(model).double()
    loss = ref(*[x.double() if x.is_floating_point() else x for x in inputs])
    loss.backward()
    return loss.detach(), ref


def assert_matches_module(traced, inputs, *, rtol: float = 1e-9, atol: float = 1e-9) -> None:
    graph = traced.graph
    got = run(replicated_program(graph), traced, inputs, dtype=torch.float64)
    want_loss, ref = module_reference(traced.module, inputs)
    torch.testing.assert_close(got.loss, want_loss.double(), rtol=rtol, atol=atol)

    # A tied weight may appear under several names (export lists each and uses one): the
    # module's gradient is the sum over the graph's names for the same tensor.
    names_of: dict[int, list[str]] = {}
    for p in graph.params:
        names_of.setdefault(id(traced.module.get_parameter(graph.values[p].target)), []).append(p)
    trainable = {id(p) for p in traced.module.parameters() if p.requires_grad}
    assert set(names_of) == trainable, "the graph's parameters are not the module's"
    for names in names_of.values():
        grad = sum(got.grads[n] for n in names)
        want = ref.get_parameter(graph.values[names[0]].target).grad
        assert want is not None, names
        torch.testing.assert_close(grad, want.double(), rtol=rtol, atol=atol,
                                   msg=lambda m, names=names: f"{names}: {m}")


@pytest.mark.parametrize("name", MODELS)
def test_model_file_contract(load_model, name):
    module = load_model(name)
    cfg = dict(module.SMALL)
    weights = []
    for _ in range(2):
        torch.manual_seed(0)
        weights.append(module.model(**cfg).state_dict())
    assert weights[0].keys() == weights[1].keys()
    for key in weights[0]:
        assert torch.equal(weights[0][key], weights[1][key]), key
    first, second = module.inputs(**cfg), module.inputs(**cfg)
    assert isinstance(first, tuple) and all(isinstance(x, torch.Tensor) for x in first)
    assert all(torch.equal(a, b) for a, b in zip(first, second))
    torch.manual_seed(0)
    loss = module.model(**cfg)(*first)
    assert loss.shape == () and loss.is_floating_point() and torch.isfinite(loss)


@pytest.mark.parametrize("name", MODELS)
def test_traced_graph_runs_like_the_module(small, name):
    traced, inputs = small(name)
    graph = traced.graph
    assert graph.meta(graph.output).shape == ()
    assert len(graph.inputs) == len(inputs)
    assert_matches_module(traced, inputs)


def test_default_sizes_match_published_models(load_model):
    """Built on the meta device (no memory): parameter counts of the models they stand for."""

    def count(name, **cfg):
        with torch.device("meta"):
            model = load_model(name).model(**cfg)
        return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())

    assert count("gpt", seq=1024) == 124_439_808          # GPT-2 small (Hugging Face "gpt2")
    assert count("bert", seq=512) == 109_514_298          # BertForMaskedLM, bert-base-uncased
    assert count("vit") == 86_567_656                     # ViT-B/16 at 224x224
    assert 20e6 < count("vgg") < 20.6e6                   # VGG19 for CIFAR-10


def test_dropout_shows_in_the_graph(load_model):
    module = load_model("gpt")
    cfg = dict(module.SMALL, dropout=0.25)
    torch.manual_seed(0)
    graph = hapc.trace(module.model(**cfg), module.inputs(**cfg)).graph
    probs = [n.args[1] for n in graph.nodes if n.op == "aten.dropout.default"]
    assert probs and all(p == 0.25 for p in probs)


def moe_per_token(layer, x: torch.Tensor) -> torch.Tensor:
    """The MoE layer written token by token: top-2 routing, first choices queue before second
    choices in token order, an expert takes at most ``capacity`` tokens, gates renormalised."""
    B, S, M = x.shape
    tokens = x.reshape(B * S, M)
    E = layer.experts
    capacity = math.ceil(layer.capacity_factor * 2 * B * S / E)
    probs = F.softmax(layer.gate(tokens), dim=-1)
    top_p, top_i = torch.topk(probs, 2, dim=-1)
    gates = top_p / top_p.sum(-1, keepdim=True)
    taken = [0] * E
    out = torch.zeros_like(tokens)
    for choice in range(2):
        for s in range(tokens.shape[0]):
            e = int(top_i[s, choice])
            if taken[e] >= capacity:
                continue
            taken[e] += 1
            h = F.gelu(tokens[s] @ layer.w_in[e] + layer.b_in[e, 0])
            out[s] += gates[s, choice] * (h @ layer.w_out[e] + layer.b_out[e, 0])
    return out.reshape(B, S, M)


@pytest.mark.parametrize("capacity_factor", [0.3, 1.25, 4.0])
def test_moe_layer_is_top2_routing_with_capacity(load_model, capacity_factor):
    module = load_model("moe")
    torch.manual_seed(0)
    layer = module.MoE(hidden=12, experts=5, capacity_factor=capacity_factor).double()
    x = torch.randn(3, 7, 12, dtype=torch.float64)
    got, aux = layer(x)
    torch.testing.assert_close(got, moe_per_token(layer, x), rtol=1e-12, atol=1e-12)
    assert aux.shape == () and aux > 0
    if capacity_factor < 1:   # some tokens were dropped: their output row is zero
        assert (got.reshape(-1, 12).abs().sum(-1) == 0).any()


@pytest.mark.parametrize("capacity_factor", [0.3])
def test_moe_with_dropped_tokens_traces_exactly(load_model, capacity_factor):
    module = load_model("moe")
    cfg = dict(module.SMALL, layers=1, capacity_factor=capacity_factor)
    torch.manual_seed(0)
    model = module.model(**cfg)
    inputs = module.inputs(**cfg)
    assert_matches_module(hapc.trace(model, inputs), inputs)


# --- Real models, unmodified: Hugging Face GPT-2 and BERT from small configs, no downloads ---

class LossOnly(torch.nn.Module):
    """``forward`` returns ``.loss``: the one wrapper a user writes around a HF model."""

    def __init__(self, inner: torch.nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.inner(input_ids=ids, labels=labels).loss


def hf_batch(vocab: int = 101) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (5, 16), generator=gen)
    labels = torch.where(torch.rand(5, 16, generator=gen) < 0.3, ids, torch.full_like(ids, -100))
    labels[:, 0] = ids[:, 0]
    return ids, labels


def hf_check(model: torch.nn.Module) -> None:
    inputs = hf_batch()
    traced = hapc.trace(LossOnly(model), inputs)
    assert traced.graph.meta(traced.graph.output).shape == ()
    # HF upcasts the logits with ``.float()``, so the "float64" module run computes its loss
    # in float32 while the executor runs float64 throughout: compare at float32 precision.
    assert_matches_module(traced, inputs, rtol=1e-5, atol=1e-6)


def test_hf_gpt2_traces_and_runs_like_the_module():
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=16, vocab_size=101,
                                     bos_token_id=0, eos_token_id=0, resid_pdrop=0.0,
                                     embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(0)
    hf_check(transformers.GPT2LMHeadModel(config))


def test_hf_bert_traces_and_runs_like_the_module():
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                     intermediate_size=256, max_position_embeddings=16, vocab_size=101,
                                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    hf_check(transformers.BertForMaskedLM(config))
