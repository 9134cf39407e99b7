"""Policy construction for a run: absolute, relative or automatic KV budgets, checked before any work.

``policy.budget_tokens: auto`` (the default of ``policy=arbor``) sizes the budget the way vLLM sizes
its pool (``gpu_memory_utilization``): on a GPU, :data:`GPU_MEMORY_FRACTION` of the device memory
free once the model is loaded; on a CPU, where a pool as large as the machine would never evict,
:data:`CPU_PATH_FACTOR` x the longest active path of the slice (its prompt plus one thought), times
``concurrency``, so the memory manager has work to do on the default task. ``null`` is unbounded.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import torch
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from arbor_cli.results import RESULTS_FILE, load_done
from arbor_cli.resume import FINGERPRINT_FILE, as_json, read_fingerprint, with_added_keys
from arbor_runtime import BudgetError
from arbor_runtime.planner import MemoryConfig, below_exact_floor, least_budget, manages_memory, opening
from arbor_runtime.tasks.base import Problem, Task

#: keys of conf/policy/*.yaml that the CLI consumes (not fields of the policy classes)
RUN_KEYS = ("budget_ratio", "budget_reference", "reference_may_differ")
#: settings of a budget reference's run that must equal the run it serves (dotted keys, or prefixes
#: ending in "."): what decides each problem's tree and so its peak
REFERENCE_KEYS = ("task.", "controller.", "verifier.", "model.spec", "model.dtype", "model.weights", "seed")
#: ``budget_tokens: auto`` on a GPU: this share of the device memory free after the model loads
GPU_MEMORY_FRACTION = 0.9
#: ``budget_tokens: auto`` on a CPU: this many times the longest active path (prompt + one thought)
CPU_PATH_FACTOR = 2
AUTO = "auto"


@dataclass(frozen=True, slots=True)
class AutoBudget:
    """The budget ``auto`` chose and how (one line for the console)."""

    tokens: int
    note: str


class PolicyFactory:
    """Builds one policy per problem, resolving ``policy.budget_ratio`` against a reference run.

    ``budget_ratio`` x (peak device KV tokens `full` needed on the same problem, read from the
    ``budget_reference`` run's results.jsonl) becomes that problem's ``budget_tokens``. With
    ``settings`` (the run's own, :func:`arbor_cli.resume.fingerprint`), the reference's recorded config
    must match them (:func:`check_reference`).
    """

    def __init__(self, policy_cfg: DictConfig, problems: list[Problem], settings: dict[str, Any] | None = None) -> None:
        node = OmegaConf.to_container(policy_cfg, resolve=True)
        self.ratio = node.pop("budget_ratio", None)
        reference = node.pop("budget_reference", None)
        may_differ = _key_list(node.pop("reference_may_differ", None) or [])
        tokens = node.get("budget_tokens")
        if self.ratio is not None and tokens not in (None, AUTO):
            raise ValueError(
                f"policy.budget_ratio={self.ratio} and policy.budget_tokens={tokens} are both set (the ratio "
                "decides each problem's budget): pass one of them, the other null"
            )
        #: ``budget_tokens: auto``, chosen by :meth:`resolve_auto` once the model is loaded
        self.auto = tokens == AUTO and self.ratio is None
        if tokens == AUTO:
            node["budget_tokens"] = None
        self.chosen: AutoBudget | None = None
        self.node = node
        self.peaks: dict[int, int] = {}
        if self.ratio is not None:
            self.peaks = _reference_peaks(float(self.ratio), reference, problems)
            if settings is not None:
                check_reference(reference, settings, may_differ)
        policy = self.build(problems[0].index if problems else None)  # validates fields now, before any work
        if tokens == AUTO and not manages_memory(policy):
            raise ValueError(
                f"policy.budget_tokens=auto: {type(policy).__name__} keeps every token, so any budget is an OOM; "
                "use policy.budget_tokens=null (or a policy that manages memory, e.g. policy=arbor)"
            )

    def build(self, index: int | None) -> Any:
        node = dict(self.node)
        if self.ratio is not None and index is not None:
            node["budget_tokens"] = max(1, int(float(self.ratio) * self.peaks[index]))
        try:
            return instantiate(node)
        except InstantiationException as exc:
            raise (exc.__cause__ or exc) from None

    def budget_for(self, index: int) -> int | None:
        return self.build(index).budget_tokens

    def resolve_auto(self, chosen: AutoBudget) -> None:
        """Fix ``budget_tokens: auto`` to what :func:`auto_budget` chose."""
        self.node["budget_tokens"], self.chosen, self.auto = chosen.tokens, chosen, False


def auto_budget(task: Task, problems: list[Problem], loaded, concurrency: int = 1) -> AutoBudget:
    """The budget ``auto`` means on the loaded model's device (module docstring)."""
    cfg = loaded.model.config
    heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    per_token = 2 * cfg.num_hidden_layers * (getattr(cfg, "num_key_value_heads", None) or heads) * head_dim
    per_token *= next(loaded.model.parameters()).element_size()
    device = loaded.device
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        tokens = int(GPU_MEMORY_FRACTION * free // per_token)
        how = f"{GPU_MEMORY_FRACTION:g} of the {free / 2**30:.1f} GiB free on {device} after the model loaded"
    else:
        prompt = max(len(loaded.tokenizer(task.prompt(p))["input_ids"]) for p in problems) if problems else 1
        path = prompt + task.max_thought_tokens
        tokens = CPU_PATH_FACTOR * path * concurrency
        times = f" x concurrency {concurrency}" if concurrency > 1 else ""
        how = (
            f"{CPU_PATH_FACTOR} x the longest active path (prompt {prompt} + one thought {task.max_thought_tokens})"
            f"{times} on {device.type}"
        )
    note = (
        f"policy.budget_tokens=auto: {tokens:,} KV tokens ({tokens * per_token / 2**20:,.0f} MiB) = {how}; "
        "set policy.budget_tokens=N to choose, null for no budget"
    )
    return AutoBudget(max(tokens, 1), note)


def check_budget(factory: PolicyFactory, task: Task, problems: list[Problem], tokenizer) -> dict[int, str]:
    """Budgets smaller than the least a problem's active path needs: its prompt plus one thought of
    ``max_thought_tokens`` in flight. (Deeper paths need more; running out then is an OOM.) Policies
    that may shrink the active path (h2o, streaming, thinkv) or that degrade below their floor
    (arbor) prefill a longer prompt in chunks, so they need room for one thought and one prompt
    token only.

    An absolute ``budget_tokens`` that is too small for any problem fails up front (BudgetError).
    Budgets derived per problem from ``budget_ratio`` are results, not input errors: the problems
    they cannot serve are returned (index -> message) and recorded as OOM without being run.
    """
    infeasible = {}
    for problem in problems:
        policy = factory.build(problem.index)
        config = MemoryConfig.of(policy)  # the pool is the budget less a sparse index's reserve (lychee, quest)
        prompt_tokens = _prompt_tokens(tokenizer, task, problem)
        first = opening(policy, config.kv_budget_tokens, prompt_tokens, task.max_thought_tokens)
        if first is None or first.fits:
            continue
        prompt = first.need - task.max_thought_tokens
        what = "one prompt token (it is prefilled in chunks)" if first.chunked else f"prompt {prompt}"
        budget, pool = config.budget_tokens, config.kv_budget_tokens
        kv = f" ({pool} for KV after the index reserve)" if budget - pool else ""
        infeasible[problem.index] = (
            f"policy.budget_tokens={budget}{kv} is smaller than the active path of problem "
            f"{problem.index} needs: {what} + one thought of {task.max_thought_tokens} tokens = {first.need}; "
            f"use a budget >= {least_budget(first.need, getattr(policy, 'index_reserve', 0.0))}"
        )
    if infeasible and factory.ratio is None:
        raise BudgetError(next(iter(infeasible.values())))
    return infeasible


def below_floor_note(factory: PolicyFactory, task: Task, problems: list[Problem], tokenizer) -> str | None:
    """One line for the run's start when a policy that degrades (arbor) has a budget below its
    exact floor on some problem: the prompt plus one thought (deeper paths raise the floor further).
    Below it the run goes on, lossy; the line says so and why. None when every budget is above it."""
    below = []
    for problem in problems:
        policy = factory.build(problem.index)
        pool, prompt = MemoryConfig.of(policy).kv_budget_tokens, _prompt_tokens(tokenizer, task, problem)
        if below_exact_floor(policy, pool, prompt, task.max_thought_tokens):
            below.append((problem.index, pool, prompt() + task.max_thought_tokens))
    if not below:
        return None
    index, budget, floor = below[0]
    return (
        f"policy.budget_tokens={budget} is below arbor's exact floor on {len(below)} of {len(problems)} problems "
        f"(problem {index}: prompt {floor - task.max_thought_tokens} + one thought of {task.max_thought_tokens} "
        f"= {floor}, plus the deepest path): there arbor is lossy, it keeps the sinks, the question and the "
        "frontier on the device and token-extracts the few-shot examples and older blocks by value, "
        "evicted spans wait on the host tier and come back as room allows; exact from the floor up"
    )


def _prompt_tokens(tokenizer, task: Task, problem: Problem) -> Callable[[], int]:
    """``problem``'s prompt length in tokens, tokenized when first asked."""
    return cache(lambda: len(tokenizer(task.prompt(problem))["input_ids"]))


def check_reference(reference: str, settings: dict[str, Any], may_differ: tuple[str, ...] = ()) -> None:
    """The budget reference must be a run of this one's task, model, search and seed (its recorded
    config, ``config_fingerprint.json``; rows are checked by :func:`_reference_peaks`) under a policy
    with no budget: its peaks are then what ``full`` needs for each problem. ValueError, one line
    naming the first settings that differ. ``may_differ``: keys (or prefixes ending in ".") allowed
    to differ, e.g. ``controller.breadth`` for a wider search inside full's narrower peak."""
    run_dir = _reference_dir(reference)
    where = f"policy.budget_reference={reference!r}"
    stored = read_fingerprint(run_dir)
    if stored is None or "settings" not in stored:
        raise ValueError(
            f"{where} has no recorded config ({run_dir / FINGERPRINT_FILE}): its peaks cannot be matched to this "
            "run; valid: a run dir arbor-solve wrote (policy=full, no budget)"
        )
    theirs = with_added_keys(stored["settings"], settings)
    policy = str(theirs.get("policy._target_", "?")).rsplit(".", 1)[-1]
    for key in ("policy.budget_tokens", "policy.budget_ratio"):
        if theirs.get(key) is not None:
            raise ValueError(
                f"{where} ran {policy} with {key}={theirs[key]}: its peaks are not what the search needs "
                "unbudgeted; valid: a run with no budget (policy=full)"
            )

    def compared(key: str) -> bool:
        wanted = any(key == k or (k.endswith(".") and key.startswith(k)) for k in REFERENCE_KEYS)
        free = any(key == k or key.startswith(k + ".") or (k.endswith(".") and key.startswith(k)) for k in may_differ)
        return wanted and not free

    ours = {k: v for k, v in settings.items() if compared(k)}
    theirs = {k: v for k, v in theirs.items() if compared(k)}
    differ = sorted(
        (k for k in ours.keys() | theirs.keys() if as_json({k: ours.get(k)}) != as_json({k: theirs.get(k)})),
        key=lambda k: (not k.endswith("._target_"), k),
    )  # what was run first (the task), then settings
    if differ:
        shown = ", ".join(
            f"{k}: {json.dumps(theirs.get(k), default=str)} -> {json.dumps(ours.get(k), default=str)}"
            for k in differ[:3]
        )
        more = f" and {len(differ) - 3} more" if len(differ) > 3 else ""
        raise ValueError(
            f"{where} is a run of other settings ({shown}{more}); valid: a run of the same task, model, search "
            "and seed, or name the settings that may differ in policy.reference_may_differ"
        )


def _key_list(value: Any) -> tuple[str, ...]:
    """``reference_may_differ``: a list of dotted setting keys."""
    if isinstance(value, str) or not all(isinstance(k, str) and k for k in value):
        raise ValueError(
            f"policy.reference_may_differ={value!r} must be a list of setting keys, e.g. [controller.breadth]"
        )
    return tuple(value)


def _reference_dir(reference: str) -> Path:
    path = Path(reference).expanduser()
    return path.parent if path.name == RESULTS_FILE else path


def _reference_peaks(ratio: float, reference: str | None, problems: list[Problem]) -> dict[int, int]:
    if ratio <= 0:
        raise ValueError(f"policy.budget_ratio={ratio} must be > 0")
    if not reference:
        raise ValueError("policy.budget_ratio needs policy.budget_reference=<run dir or results.jsonl of a full run>")
    run_dir = _reference_dir(reference)
    if not (run_dir / RESULTS_FILE).is_file():
        raise FileNotFoundError(f"policy.budget_reference={reference!r} has no {RESULTS_FILE}")
    rows = load_done(run_dir)
    missing = [p.index for p in problems if p.index not in rows or rows[p.index].get("oom")]
    if missing:
        raise ValueError(f"policy.budget_reference={reference!r} lacks a finished (non-OOM) run of problems {missing}")
    return {p.index: int(rows[p.index]["peak_device_tokens"]) for p in problems}
