"""The device check script's dry run (what CI can run of it): tests, then every policy and budget
on the tiny model through the same code, one JSON and a table."""

from __future__ import annotations

import ast
import importlib.metadata as md
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from packaging.requirements import Requirement

from benchmarks.gpu_check import DRY_WORKLOAD, plan

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[1]


def test_gpu_check_dry_run_runs_every_policy_and_budget_and_checks_the_restore_order(tmp_path):
    env = os.environ | {"PYTHON": sys.executable}
    proc = subprocess.run(
        ["bash", "scripts/gpu_check.sh", "--dry-run", "--out", str(tmp_path)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "full peak" in proc.stdout and "arbor" in proc.stdout  # the table
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["dry_run"] and report["kernel"] == "cpu_flash"
    tests = report["tests"]
    assert tests["failures"] == tests["errors"] == 0 and tests["passed"] > 0 and tests["skipped"] > 0

    runs = {(r["policy"], r["fraction"]): r for r in report["runs"]}
    assert list(runs) == plan(["full", "h2o", "streaming", "thinkv", "arbor"], [1.0, 0.5, 0.25])
    peak = report["full_peak_tokens"]
    assert peak >= DRY_WORKLOAD.tokens and runs[("full", 1.0)]["peak_device_kv_tokens"] == peak
    assert runs[("full", 0.5)]["oom"] and runs[("full", 0.25)]["oom"]
    for (policy, fraction), r in runs.items():
        assert "skipped" not in r and not r["truncated"] and r["peak_device_kv_tokens"] <= r["budget_tokens"]
        assert r["host_syncs"] == 0 and r["restores_inside_forward"] == 0
        assert 0 < r["max_scratch_over_bound"] <= 1  # every forward within arbor_runtime/scratch.py's bound
        if r["oom"] is None:
            assert r["tree_tokens"] >= DRY_WORKLOAD.tokens and r["decode_tokens_per_s"] > 0
        if policy in ("h2o", "streaming", "thinkv") and fraction < 1.0:
            assert r["dropped_tokens"] > 0 and r["rehydrated_tokens"] == 0
    for fraction in (0.5, 0.25):
        arbor = runs[("arbor", fraction)]
        assert arbor["oom"] is None and arbor["rehydrated_tokens"] > 0
        assert arbor["restore_bytes"] == arbor["rehydrated_tokens"] * 512  # tiny model: 512 bytes of K/V per token
        assert arbor["compute_waits"] >= arbor["restore_batches"] > 0 and arbor["restore_gb_per_s"] > 0


# --- the wheels a device run carries (scripts/gpu_wheels.txt) against what the project imports -------------

PACKAGE_DIRS = ("arbor_runtime", "arbor_cli", "controllers", "tasks", "verifiers")
DEVICE_TESTS = ("conftest.py", "synthetic_data.py", "test_gpu.py", "test_cuda_kernels.py")  # what gpu_check.sh runs
DEVICE_FILES = ("tests/fixtures/tiny_llama.py", "benchmarks/gpu_check.py", "benchmarks/random_model.py")  # and imports
# Imported only inside functions, for features the device run does not use: neither the image nor the
# carried wheels need them (a module-level import of one of these fails the test below).
OPTIONAL = {
    "datasets": "the hub extra (task data by dataset id)",
    "ray": "the ray extra (runner=ray)",
    "kvpress": "not a dependency (the kvpress side benchmark; it pins transformers < 5.3)",
}
# The device run targets CPython 3.12 on Linux x86-64: requirement markers are evaluated for it.
DEVICE_MARKERS = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
                  "platform_system": "Linux", "platform_machine": "x86_64", "implementation_name": "cpython",
                  "platform_python_implementation": "CPython", "os_name": "posix", "extra": ""}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pins(path: Path) -> dict[str, tuple[str | None, set[str]]]:
    """``name: (version or None, flags)`` from a ``name[==version] [flag ...]  # comment`` file."""
    out = {}
    for line in path.read_text().splitlines():
        words = line.split("#", 1)[0].split()
        if words:
            name, _, version = words[0].partition("==")
            out[_norm(name)] = (version or None, set(words[1:]))
    return out


def _third_party_imports() -> dict[str, bool]:
    """Top-level third-party module names the package (and the tests the device runs) import:
    ``name: True`` where some import of it runs at module import, ``False`` where all are inside functions."""
    local = {p.name for p in REPO.iterdir() if p.is_dir()} | {p.stem for p in (REPO / "tests").glob("*.py")}
    local |= {p.name for p in (REPO / "tests").iterdir() if p.is_dir()}  # tests/fixtures
    files = [f for d in PACKAGE_DIRS for f in sorted((REPO / d).rglob("*.py"))]
    files += [REPO / "tests" / name for name in DEVICE_TESTS] + [REPO / name for name in DEVICE_FILES]
    found: dict[str, bool] = {}

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            names = []
            if isinstance(child, ast.Import):
                names = [a.name for a in child.names]
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                names = [child.module]
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top not in local and top != "__future__":
                    found[top] = found.get(top, False) or not in_function
            visit(child, in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda))

    for f in files:
        visit(ast.parse(f.read_text(), str(f)), False)
    return found


def _requirements(dist: str) -> list[Requirement]:
    """``dist``'s own requirements that apply on the device (no extras), from its metadata here."""
    reqs = [Requirement(r) for r in md.requires(dist) or []]
    return [r for r in reqs if r.marker is None or r.marker.evaluate(DEVICE_MARKERS)]


def test_the_carried_wheels_are_exactly_what_the_device_lacks():
    device = _pins(REPO / "scripts" / "gpu_device_packages.txt")
    wheels = _pins(REPO / "scripts" / "gpu_wheels.txt")
    assert {"torch", "transformers", "numpy"} <= device.keys() and all(v for v, _ in wheels.values())
    module_dists = {m: [_norm(d) for d in ds] for m, ds in md.packages_distributions().items()}

    # what the project needs: its declared dependencies and every third-party module it imports
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    specs = [Requirement(r) for r in project["dependencies"]]
    needed = {_norm(r.name): "pyproject dependencies" for r in specs}
    unresolved = []
    for module, at_import in sorted(_third_party_imports().items()):
        if module in OPTIONAL:
            assert not at_import, f"{module} ({OPTIONAL[module]}) is imported at module level: the device run needs it"
            continue
        if module not in module_dists:
            unresolved.append(module)
        for dist in module_dists.get(module, []):
            needed.setdefault(dist, f"import {module}")
    assert not unresolved, f"imports no installed distribution provides (add them to OPTIONAL or install): {unresolved}"

    # and what the carried ones need in turn (the image's own packages bring their own)
    queue = [d for d in needed if d in wheels]
    while queue:
        dist = queue.pop()
        for req in _requirements(dist):
            name = _norm(req.name)
            specs.append(req)
            if name not in needed:
                needed[name] = f"required by {dist}"
                if name not in device:
                    queue.append(name)

    missing = {d: why for d, why in needed.items() if d not in device and d not in wheels}
    assert not missing, f"the device lacks these and scripts/gpu_wheels.txt does not carry them: {missing}"
    unneeded = sorted(set(wheels) - set(needed))
    assert not unneeded, f"scripts/gpu_wheels.txt carries what nothing needs: {unneeded}"
    shadowing = sorted(d for d in set(wheels) & set(device) if "override" not in wheels[d][1])
    assert not shadowing, f"the device has these; carry one only with 'override' and a reason: {shadowing}"

    # every version the device run will import satisfies what asks for it
    for req in specs:
        name = _norm(req.name)
        version = wheels[name][0] if name in wheels else device.get(name, (None, set()))[0]
        if version is not None:
            assert req.specifier.contains(version, prereleases=True), f"{name}=={version} does not satisfy {req}"


def test_the_carried_wheels_are_the_versions_setup_installs_and_this_test_reads():
    # the test above reads each carried package's requirements from the installed copy: valid only when
    # that copy is the carried version, which constraints.txt (what `make setup` installs) fixes
    wheels = _pins(REPO / "scripts" / "gpu_wheels.txt")
    constraints = _pins(REPO / "constraints.txt")
    for name, (version, _) in wheels.items():
        pinned = constraints.get(name, (None,))[0]
        assert pinned == version, f"constraints.txt and scripts/gpu_wheels.txt pin {name} differently"
        assert md.version(name) == version, f"installed {name}=={md.version(name)}, carried {version}: run make setup"


def test_constraints_pin_every_line_and_leave_torch_to_the_makefile():
    lines = [w for line in (REPO / "constraints.txt").read_text().splitlines() if (w := line.split("#", 1)[0].strip())]
    assert lines and all(re.fullmatch(r"[A-Za-z0-9_.\-]+==[^\s=]+", w) for w in lines), lines
    assert "torch" not in _pins(REPO / "constraints.txt")  # a CUDA build must satisfy them too
    assert "-c constraints.txt" in (REPO / "Makefile").read_text()


def test_the_device_run_checks_that_each_carried_package_comes_from_the_carried_folder():
    # scripts/gpu_device_run.sh fails when one of these resolves to the image's copy instead
    text = (REPO / "scripts" / "gpu_device_run.sh").read_text()
    carried = ast.literal_eval(re.search(r"^carried = (\(.*?\))$", text, re.M).group(1))
    module_dists = md.packages_distributions()
    wheels = _pins(REPO / "scripts" / "gpu_wheels.txt")
    assert {_norm(d) for m in carried for d in module_dists[m]} == set(wheels)
