"""Device memory is the budget: walked tensors, profiler-measured scratch, sub-batching, preemption,
chunked prefill of prompts larger than the budget.

The walk counts the KV-shaped tensors the runtime holds (the pool, allocated at exactly the budget);
what each forward allocates beyond it, copies inside attention included, is measured from the
allocator's events and held to ``arbor_runtime/scratch.py``'s bound in ``tests/test_scratch.py``."""

from __future__ import annotations

import pytest
import torch

from arbor_runtime import BudgetError, KVBudgetExceeded, Runtime, SamplingParams, build_policy
from benchmarks.memprof import transient_peak_bytes

pytestmark = pytest.mark.exactness  # CI runs these again under another ATEN_CPU_CAPABILITY

PROMPT = "Input: 4 4 6 8\nSteps:\n"
LONG_PROMPT = "Use numbers and basic arithmetic operations (+ - * /) to obtain 24. " * 6 + "\nInput: 4 4 6 8\nSteps:\n"


def walked_kv_bytes(*roots) -> int:
    """Bytes of every KV-shaped tensor (…, head_dim last, 3+ dims) reachable from ``roots``.

    Walks the runtime's own objects (not the weights of any module, the model's or a policy's
    scorer; not the host tier) and counts each tensor's whole storage once: what is allocated,
    not what the counters say.
    """
    rt = roots[0]
    head_dim = rt.backend.shape.head_dim
    skip = {id(rt.model), id(rt.tokenizer), id(rt.store.host)}
    seen, storages, stack = set(), {}, list(roots)
    while stack:
        obj = stack.pop()
        if id(obj) in seen or id(obj) in skip or isinstance(obj, torch.nn.Module):
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            if obj.dim() >= 3 and obj.shape[-1] == head_dim:
                storages[obj.untyped_storage().data_ptr()] = obj.untyped_storage().nbytes()
        elif isinstance(obj, dict):
            stack.extend(obj.values())
        elif isinstance(obj, list | tuple | set | frozenset):
            stack.extend(obj)
        elif type(obj).__module__.startswith("arbor_runtime"):
            names = getattr(type(obj), "__slots__", ()) or getattr(obj, "__dict__", {})
            stack.extend(getattr(obj, n) for n in names if hasattr(obj, n))
    return sum(storages.values())


def watch_forwards(rt: Runtime, seen: list[int]) -> None:
    """Walk the runtime (and the batch in flight) before and after every model forward."""
    forward = rt.backend.forward

    def watched(batch, *args, **kwargs):
        seen.append(walked_kv_bytes(rt, batch))
        out = forward(batch, *args, **kwargs)
        seen.append(walked_kv_bytes(rt, batch))
        return out

    rt.backend.forward = watched


@pytest.mark.parametrize("policy", ["full", "h2o", "streaming", "thinkv", "snapkv", "arbor", "kvp"])
def test_walked_device_kv_never_exceeds_the_budget(tiny, policy):
    budget = 60
    rt = Runtime(tiny, policy=policy, budget_tokens=budget, seed=1)
    seen: list[int] = []
    watch_forwards(rt, seen)
    params = SamplingParams(max_new_tokens=10, temperature=1.0)
    try:
        root = rt.new_tree(PROMPT)
        kids = rt.expand(root, 3, params)
        rt.expand_many([(kids[0], 2), (kids[2], 2)], params)
        rt.append(kids[1], " ok (left: 1 2)")
    except KVBudgetExceeded:
        assert policy == "full"
    cap = budget * rt.backend.shape.bytes_per_token
    assert seen and max(seen) <= cap
    assert rt.store.pool.nbytes == cap  # the pool is the budget, allocated once
    assert rt.metrics.peak_device_tokens <= budget


def test_expansion_scratch_does_not_grow_with_rows_times_context(tiny, one_torch_thread):
    """The profiler's peak transient allocation of an 8-row expansion barely moves when the shared
    context grows 6x: no per-row copy of the context (that copy alone would be 8 x 500 tokens)."""
    params = SamplingParams(max_new_tokens=4, temperature=1.0, seed=0)
    peaks = {}
    for words in (10, 60):
        rt = Runtime(tiny, policy="h2o")  # statistics on: the heaviest attention path
        root = rt.new_tree(" ".join(["seven"] * words * 10))
        peaks[root.length], _ = transient_peak_bytes(lambda rt=rt, root=root: rt.expand(root, 8, params))
    (short, p_short), (long, p_long) = sorted(peaks.items())
    per_row_copy = 8 * (long - short) * tiny_bytes_per_token(tiny)
    assert long - short >= 400
    assert p_long - p_short < per_row_copy / 4


def tiny_bytes_per_token(tiny) -> int:
    return Runtime(tiny).backend.shape.bytes_per_token


def test_split_and_preempted_expansion_samples_what_one_batch_samples(tiny):
    # top_k: the random model's distribution is nearly uniform over 49k tokens, where float noise
    # between batch shapes (1e-7) could move a draw to a neighbouring token; among the top 20 it cannot
    params = SamplingParams(max_new_tokens=12, temperature=1.0, top_k=20, seed=11, stop_at_eos=False)
    free = Runtime(tiny)
    one_batch = free.expand(free.new_tree(PROMPT), 6, params)
    budget = one_batch[0].parent.length + 16  # two first pages fit; a growing row then needs a preemption
    tight = Runtime(tiny, policy="arbor", budget_tokens=budget)
    split = tight.expand(tight.new_tree(PROMPT), 6, params)
    assert [k.token_ids for k in split] == [k.token_ids for k in one_batch]
    assert [k.id for k in split] == [k.id for k in one_batch]
    assert tight.metrics.preemptions > 0 and tight.metrics.forward_calls > free.metrics.forward_calls
    assert tight.metrics.peak_device_tokens <= budget
    assert all(
        torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4)
        for a, b in zip(split, one_batch, strict=True)
    )


def test_full_runs_rows_one_after_another_then_runs_out(tiny):
    params = SamplingParams(max_new_tokens=8, temperature=1.0, seed=2, stop_at_eos=False)
    probe = Runtime(tiny)
    budget = len(probe.new_tree(PROMPT).token_ids) + 20  # one row at a time; two children, not three
    rt = Runtime(tiny, policy="full", budget_tokens=budget)
    root = rt.new_tree(PROMPT)
    assert [len(k.token_ids) for k in rt.expand(root, 2, params)] == [8, 8]
    with pytest.raises(KVBudgetExceeded, match=f"budget_tokens={budget}"):
        rt.expand(root, 1, params)
    assert rt.metrics.peak_device_tokens <= budget
    assert len(root.children) == 2  # the failed expansion left nothing behind
    assert rt.store.pool.used == rt.store.resident_tokens  # and no slots in flight


@pytest.mark.parametrize("policy", ["h2o", "streaming", "thinkv", "snapkv", "kvp"])
def test_prompt_larger_than_the_budget_is_prefilled_in_chunks(tiny, policy):
    budget = 48
    rt = Runtime(tiny, policy=policy, budget_tokens=budget)
    root = rt.new_tree(LONG_PROMPT)
    assert root.length > 2 * budget
    assert rt.metrics.peak_device_tokens <= budget and rt.metrics.dropped_tokens > 0
    assert rt.metrics.prefill_tokens == root.length  # every prompt token computed once
    kids = rt.expand(root, 2, SamplingParams(max_new_tokens=6, temperature=1.0, seed=0))
    assert all(k.length for k in kids) and rt.metrics.peak_device_tokens <= budget
    if policy == "streaming":
        assert rt.store.get(root.id).kept[:4].tolist() == [0, 1, 2, 3]  # sinks survive every chunk


def test_full_and_all_or_nothing_arbor_refuse_a_prompt_larger_than_the_budget(tiny):
    for policy in (build_policy("full", budget_tokens=20), build_policy("arbor", budget_tokens=20, degrade=False)):
        rt = Runtime(tiny, policy=policy)
        with pytest.raises(BudgetError, match="budget_tokens=20 is smaller than the root prompt"):
            rt.new_tree(LONG_PROMPT)
        assert rt.store.pool.used == 0


def test_arbor_prefills_a_prompt_larger_than_the_budget_in_chunks_keeping_every_token_on_the_host(tiny):
    """Below its floor arbor degrades: the prompt is prefilled in chunks like a tree-blind policy's,
    but what leaves the device goes to the host tier (nothing dropped) and the sinks stay."""
    budget = 48
    rt = Runtime(tiny, policy="arbor", budget_tokens=budget)
    root = rt.new_tree(LONG_PROMPT)
    assert root.length > 2 * budget
    m = rt.metrics
    assert m.peak_device_tokens <= budget and m.dropped_tokens == 0 and m.evicted_tokens > 0
    assert rt.store.resident_tokens + rt.store.host_tokens == root.length  # every token in some tier
    assert m.prefill_tokens == root.length
    assert {0, 1, 2, 3} <= set(rt.store.get(root.id).kept.tolist())  # the sinks are pinned
    kids = rt.expand(root, 2, SamplingParams(max_new_tokens=6, temperature=1.0, seed=0))
    assert all(k.length for k in kids) and rt.metrics.peak_device_tokens <= budget


def test_fallback_kernel_generates_what_generate_does(tiny):
    rt = Runtime(tiny, fast_kernel=False, policy="h2o")
    assert rt.backend.kernel.fast is None
    node = rt.new_tree(PROMPT)
    for _ in range(3):
        node = rt.expand(node, 1, SamplingParams(max_new_tokens=5, temperature=0.0))[0]
    ids = rt.path_token_ids(node)
    root_len = node.root.length
    ref = tiny.model.generate(torch.tensor([ids[:root_len]]), max_new_tokens=len(ids) - root_len, do_sample=False)
    assert ids == ref[0].tolist()
