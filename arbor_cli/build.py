"""One builder from a composed config to what a run needs: task, verifier, policies, model, and a
fresh runtime and controller per problem.

``arbor-solve`` (:mod:`arbor_cli.run`), trace recording (``benchmarks/cli.py``) and MSVE
calibration (``scripts/calibrate_msve.py``) all build through :func:`build`, so an option of the
config means the same thing everywhere.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hydra import compose, initialize_config_module
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig

from arbor_cli.budget import PolicyFactory, auto_budget
from arbor_cli.resume import fingerprint
from arbor_cli.switches import normalize_switches
from arbor_cli.validate import validate_config
from arbor_runtime import ArborError, LoadedModel, Policy, Runtime, load_model
from arbor_runtime.attention.support import check_policy, model_attention
from arbor_runtime.controllers.base import Controller
from arbor_runtime.tasks.base import Problem, Task
from arbor_runtime.verifiers.base import Verifier

#: errors a user's config or data can cause: reported as one line, exit code 2
USER_ERRORS = (ArborError, ValueError, FileNotFoundError, KeyError, TypeError)
#: keys of ``conf/model/*.yaml`` passed to :func:`arbor_runtime.load_model`
MODEL_KEYS = ("spec", "device", "dtype", "trust_remote_code", "weights")


def compose_config(overrides: Sequence[str] = ()) -> DictConfig:
    """arbor-solve's config (``conf/config.yaml``) with command-line style ``overrides``."""
    with initialize_config_module(config_module="arbor_cli.conf", version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


@dataclass(slots=True)
class Setup:
    """Everything one run builds once, and the per-problem factories.

    Attributes:
        cfg: the composed config.
        task / verifier / problems: the task, its verifier, the problems of the slice.
        policies: one policy per problem (relative budgets resolved per problem).
        loaded: the model and tokenizer.
    """

    cfg: DictConfig
    task: Task
    verifier: Verifier
    problems: list[Problem]
    policies: PolicyFactory
    loaded: LoadedModel

    def seed(self, problem: Problem) -> int:
        """The runtime seed of a problem: ``cfg.seed`` plus its index, whatever else runs."""
        return int(self.cfg.seed) + problem.index

    def runtime(self, problem: Problem, policy: str | Policy | None = None) -> Runtime:
        """A fresh runtime for ``problem``: the config's policy for it unless ``policy`` is given."""
        chosen = self.policies.build(problem.index) if policy is None else policy
        return Runtime(self.loaded, policy=chosen, seed=self.seed(problem), share_prefixes=self.share_prefixes)

    def shared_runtime(self) -> Runtime:
        """One runtime for every problem (``concurrency`` > 1): one policy, one budget, the config's seed."""
        policy = self.policies.build(None)
        return Runtime(self.loaded, policy=policy, seed=int(self.cfg.seed), share_prefixes=self.share_prefixes)

    @property
    def share_prefixes(self) -> bool:
        """``share_prefixes`` (checked by :func:`prepare`): trees of a runtime store a common prefix once."""
        return bool(self.cfg.get("share_prefixes", True))

    def controller(self, runtime: Runtime) -> Controller:
        """The configured controller over ``runtime`` (the verifier is bound to it)."""
        return instantiate(self.cfg.controller, runtime=runtime, task=self.task, verifier=self.verifier)


@dataclass(slots=True)
class Prepared:
    """The cheap half of a run, built and checked before the model loads (see :func:`prepare`)."""

    cfg: DictConfig
    task: Task
    verifier: Verifier
    problems: list[Problem]
    policies: PolicyFactory
    concurrency: int


def prepare(cfg: DictConfig, device: str | None = None) -> Prepared:
    """Task, verifier, problems and policies from ``cfg``, with the whole config checked
    (:func:`arbor_cli.validate.validate_config`): a bad value fails here, before the model loads."""
    normalize_switches(cfg)
    task = build_task(cfg)
    verifier = build_verifier(cfg, task)
    problems = task.problems()
    policies = PolicyFactory(cfg.policy, problems, fingerprint(cfg)[1])  # a budget reference must match the run
    concurrency = check_concurrency(cfg, policies)
    check_share_prefixes(cfg)
    validate_config(cfg, policies, device=device)
    return Prepared(cfg, task, verifier, problems, policies, concurrency)


def load(prepared: Prepared, loaded: LoadedModel | None = None, device: str | None = None) -> Setup:
    """The model for a prepared run (``loaded`` reuses one loaded before); ``policy.budget_tokens: auto``
    is chosen once it has loaded (``setup.policies.chosen`` says how)."""
    p = prepared
    loaded = loaded or load_model(**model_kwargs(p.cfg.model) | ({"device": device} if device else {}))
    # a sparse policy over a model with windows, soft caps or sinks: refused here, not in the search
    check_policy(p.policies.build(None), model_attention(loaded.model))
    if p.policies.auto:
        p.policies.resolve_auto(auto_budget(p.task, p.problems, loaded, p.concurrency))
    return Setup(p.cfg, p.task, p.verifier, p.problems, p.policies, loaded)


def build(cfg: DictConfig, loaded: LoadedModel | None = None, device: str | None = None) -> Setup:
    """Task, verifier, policies and model from ``cfg``; user errors raise one of :data:`USER_ERRORS`.

    :func:`prepare` then :func:`load`: a bad value fails before the model loads. ``loaded`` reuses a
    model loaded before (it must be the one ``cfg.model`` names); ``device`` overrides
    ``cfg.model.device`` (a driver whose workers run the model keeps it on the CPU).
    """
    return load(prepare(cfg, device=device), loaded=loaded, device=device)


def check_concurrency(cfg: DictConfig, policies: PolicyFactory) -> int:
    """``concurrency``: a positive integer; above 1, searches share one runtime, so one budget."""
    value = cfg.get("concurrency", 1)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"concurrency={value!r} must be a positive integer (searches in flight at once)")
    if value > 1 and policies.ratio is not None:
        raise ValueError(
            f"concurrency={value} shares one runtime and one budget between searches: use an absolute "
            "policy.budget_tokens, not policy.budget_ratio (a budget per problem)"
        )
    return value


def check_share_prefixes(cfg: DictConfig) -> None:
    """``share_prefixes``: true or false (trees of one runtime store a common prompt prefix once)."""
    value = cfg.get("share_prefixes", True)
    if not isinstance(value, bool):
        raise ValueError(f"share_prefixes={value!r} must be true or false (store a prompt prefix common to trees once)")


def build_task(cfg: DictConfig) -> Task:
    """The configured task (its data loaded)."""
    return instantiate_user(cfg.task)


def build_verifier(cfg: DictConfig, task: Task) -> Verifier:
    """The configured verifier (the task's own unless ``verifier=`` chose another); it must fit the task."""
    verifier = instantiate_user(cfg.verifier)
    if task.verifiers and verifier.name not in task.verifiers:
        raise ValueError(f"verifier={verifier.name} does not fit task={task.name}; valid: {', '.join(task.verifiers)}")
    verifier.check_task(task)
    return verifier


def model_kwargs(model_cfg: DictConfig) -> dict[str, Any]:
    """``load_model`` arguments from the model config (unset keys left to its defaults)."""
    return {k: model_cfg.get(k) for k in MODEL_KEYS if model_cfg.get(k) is not None}


def instantiate_user(node: DictConfig, **kwargs: Any) -> Any:
    """``instantiate`` that surfaces the target's own error when a user can cause it (Hydra wraps it)."""
    try:
        return instantiate(node, **kwargs)
    except InstantiationException as exc:
        cause = exc.__cause__
        if isinstance(cause, USER_ERRORS):
            raise cause from None
        raise
