"""CPU kernels for the sparse decode step: the read (attention over K/V at given pool slots, read in
place) and the flat chunk scan (int8 centroid scores without a float32 table).

The torch path (:func:`~arbor_runtime.sparse.step.gather_heads` then ``scaled_dot_product_attention``)
copies the chosen keys and values out of the pool and reads the copies again; on one CPU thread at 8K
that copy is the largest part of a sparse step (memory bound). :func:`gather_attend` reads each chosen
key and value once where it lies, with a three-pass softmax per row and KV head (scores, weights,
values). :func:`centroid_scores` widens each int8 centroid as it scores it, where the torch scan first
converts the layer's whole table to float32. Both agree with the torch path to float rounding (their
sums run in another order), not bit for bit.

Built on first use with ``torch.utils.cpp_extension.load_inline`` (a C++ compiler and ninja: about half
a minute, cached under ``TORCH_EXTENSIONS_DIR``). Without them, off CPU, or for other dtypes the step
keeps the torch path; ``ARBOR_NATIVE=0`` keeps it too (the side-by-side check:
``python -m benchmarks.sparse_profile --native``).
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import shutil
import threading

import torch

log = logging.getLogger(__name__)

_SOURCE = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <cmath>
#include <vector>

namespace {

struct Table {
  const float* ptr;
  int64_t base, cap, head_stride, slot_stride;
};

std::vector<Table> tables(const std::vector<torch::Tensor>& parts, const std::vector<int64_t>& bases, int64_t H,
                          int64_t D) {
  TORCH_CHECK(parts.size() == bases.size() && !parts.empty(), "one base per arena");
  std::vector<Table> out;
  for (size_t a = 0; a < parts.size(); ++a) {
    const auto& t = parts[a];
    TORCH_CHECK(t.dim() == 3 && t.scalar_type() == torch::kFloat32 && t.stride(2) == 1 && t.size(0) == H &&
                    t.size(2) == D, "arena tables must be (H, cap, D) float32 with D contiguous");
    out.push_back({t.data_ptr<float>(), bases[a], t.size(1), t.stride(0), t.stride(1)});
  }
  return out;
}

// K or V row of KV head h at pool slot ``slot`` (nullptr: in no arena)
inline const float* row(const std::vector<Table>& ts, int64_t h, int64_t slot) {
  for (const auto& t : ts) {
    if (slot >= t.base && slot < t.base + t.cap) return t.ptr + h * t.head_stride + (slot - t.base) * t.slot_stride;
  }
  return nullptr;
}

// rows this far ahead are fetched while the current one is used (chosen keys lie apart in the pool)
constexpr int64_t AHEAD = 16;

inline void prefetch_row(const float* p, int64_t d) {
  if (p == nullptr) return;
  for (int64_t i = 0; i < d; i += 16) __builtin_prefetch(p + i);
}

// One row and KV head: o (G, D) = softmax(scale q.k) v over the n valid of S slots. DD: the head dim at
// compile time (0: the runtime D). score: G * S scratch; keys / values: n row pointers scratch.
template <int64_t DD>
void attend_head(const float* __restrict q, const int64_t* slots, const bool* ok, int64_t S, int64_t G, int64_t Drt,
                 int64_t h, float scale, const std::vector<Table>& kt, const std::vector<Table>& vt,
                 float* __restrict score, const float** vrow, float* __restrict o) {
  const int64_t D = DD ? DD : Drt;
  int64_t n = 0;
  for (int64_t s = 0; s < S; ++s) {  // pass 1: the keys, read once
    if (!ok[s]) continue;
    if (s + AHEAD < S && ok[s + AHEAD]) {
      prefetch_row(row(kt, h, slots[s + AHEAD]), D);
      prefetch_row(row(vt, h, slots[s + AHEAD]), D);
    }
    const float* __restrict k = row(kt, h, slots[s]);
    vrow[n] = row(vt, h, slots[s]);
    TORCH_CHECK(k != nullptr && vrow[n] != nullptr, "slot ", slots[s], " is in no arena");
    for (int64_t g = 0; g < G; ++g) {
      const float* __restrict qg = q + g * D;
      float acc = 0.f;
      for (int64_t d = 0; d < D; ++d) acc += qg[d] * k[d];
      score[g * S + n] = acc * scale;
    }
    ++n;
  }
  if (n == 0) return;
  for (int64_t g = 0; g < G; ++g) {  // pass 2: weights exp(s - max) / sum, vectorized
    float* __restrict sg = score + g * S;
    float top = sg[0];
    for (int64_t i = 1; i < n; ++i) top = sg[i] > top ? sg[i] : top;
    float sum = 0.f;
    for (int64_t i = 0; i < n; ++i) {
      sg[i] = std::exp(sg[i] - top);
      sum += sg[i];
    }
    const float inv = 1.f / sum;
    for (int64_t i = 0; i < n; ++i) sg[i] *= inv;
  }
  for (int64_t i = 0; i < n; ++i) {  // pass 3: the values, read once
    const float* __restrict v = vrow[i];
    for (int64_t g = 0; g < G; ++g) {
      const float w = score[g * S + i];
      float* __restrict og = o + g * D;
      for (int64_t d = 0; d < D; ++d) og[d] += w * v[d];
    }
  }
}

// o[n] = scale[n] * max_g q_g . code_n over N nodes of one KV head (codes int8, rows ``cns`` apart).
template <int64_t DD>
void score_nodes(const float* __restrict q, const int8_t* codes, int64_t cns, const at::Half* scales, int64_t sns,
                 int64_t N, int64_t G, int64_t Drt, float* __restrict o) {
  const int64_t D = DD ? DD : Drt;
  std::vector<float> widened(DD ? 0 : Drt);
  float fixed[DD ? DD : 1];
  float* __restrict cf = DD ? fixed : widened.data();  // the node's codes as float, converted once
  for (int64_t n = 0; n < N; ++n) {
    const int8_t* __restrict c = codes + n * cns;
    for (int64_t d = 0; d < D; ++d) cf[d] = static_cast<float>(c[d]);
    float best = 0.f;
    for (int64_t g = 0; g < G; ++g) {
      const float* __restrict qg = q + g * D;
      float acc = 0.f;
      for (int64_t d = 0; d < D; ++d) acc += qg[d] * cf[d];
      best = (g == 0 || acc > best) ? acc : best;
    }
    o[n] = best * static_cast<float>(scales[n * sns]);
  }
}

}  // namespace

// q (R, H, G, D) float32 contiguous; keys / values: per arena (H, cap, D) float32; bases: each arena's
// first slot; slots (R, H, S) int64 pool slots; valid (R, H, S) bool. Returns (R, H, G, D) float32:
// softmax(scale q.k) v over the valid slots (0 where a row and head has none).
torch::Tensor gather_attend(torch::Tensor q, std::vector<torch::Tensor> keys, std::vector<torch::Tensor> values,
                            std::vector<int64_t> bases, torch::Tensor slots, torch::Tensor valid, double scale) {
  TORCH_CHECK(q.dim() == 4 && q.scalar_type() == torch::kFloat32 && q.is_contiguous(), "q: (R, H, G, D) float32");
  TORCH_CHECK(slots.scalar_type() == torch::kInt64 && valid.scalar_type() == torch::kBool, "slots int64, valid bool");
  const int64_t R = q.size(0), H = q.size(1), G = q.size(2), D = q.size(3), S = slots.size(2);
  TORCH_CHECK(slots.dim() == 3 && slots.size(0) == R && slots.size(1) == H && valid.sizes() == slots.sizes(),
              "slots / valid: (R, H, S)");
  const auto kt = tables(keys, bases, H, D), vt = tables(values, bases, H, D);
  auto sc = slots.contiguous();
  auto vc = valid.contiguous();
  auto out = torch::zeros_like(q);
  const int64_t* sp = sc.data_ptr<int64_t>();
  const bool* vp = vc.data_ptr<bool>();
  const float* qp = q.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const float fscale = static_cast<float>(scale);
  at::parallel_for(0, R * H, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> score(G * S);
    std::vector<const float*> vrow(S);
    for (int64_t rh = begin; rh < end; ++rh) {
      const float* qr = qp + rh * G * D;
      float* o = op + rh * G * D;
      const int64_t h = rh % H;
      if (D == 64) {
        attend_head<64>(qr, sp + rh * S, vp + rh * S, S, G, D, h, fscale, kt, vt, score.data(), vrow.data(), o);
      } else if (D == 128) {
        attend_head<128>(qr, sp + rh * S, vp + rh * S, S, G, D, h, fscale, kt, vt, score.data(), vrow.data(), o);
      } else {
        attend_head<0>(qr, sp + rh * S, vp + rh * S, S, G, D, h, fscale, kt, vt, score.data(), vrow.data(), o);
      }
    }
  });
  return out;
}

// Every node's centroid score of one layer: codes (H, N, D) int8 (D contiguous), scales (H, N) float16,
// q (r, H, G, D) float32 contiguous. Returns (r, H, N) float32: max over the G query heads of q.code,
// times the node's scale (a positive scale: the same as the max of the scaled dots).
torch::Tensor centroid_scores(torch::Tensor codes, torch::Tensor scales, torch::Tensor q) {
  TORCH_CHECK(codes.dim() == 3 && codes.scalar_type() == torch::kInt8 && codes.stride(2) == 1, "codes: (H, N, D) int8");
  TORCH_CHECK(scales.dim() == 2 && scales.scalar_type() == torch::kHalf, "scales: (H, N) float16");
  TORCH_CHECK(q.dim() == 4 && q.scalar_type() == torch::kFloat32 && q.is_contiguous(), "q: (r, H, G, D) float32");
  const int64_t R = q.size(0), H = q.size(1), G = q.size(2), D = q.size(3), N = codes.size(1);
  TORCH_CHECK(codes.size(0) == H && codes.size(2) == D && scales.size(0) == H && scales.size(1) == N, "shapes");
  auto out = torch::empty({R, H, N}, q.options());
  const int8_t* cp = codes.data_ptr<int8_t>();
  const at::Half* sp = scales.data_ptr<at::Half>();
  const int64_t chs = codes.stride(0), cns = codes.stride(1), shs = scales.stride(0), sns = scales.stride(1);
  const float* qp = q.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, R * H, 1, [&](int64_t begin, int64_t end) {
    for (int64_t rh = begin; rh < end; ++rh) {
      const int64_t h = rh % H;
      const float* __restrict qr = qp + rh * G * D;
      float* __restrict o = op + rh * N;
      if (D == 64) {
        score_nodes<64>(qr, cp + h * chs, cns, sp + h * shs, sns, N, G, D, o);
      } else {
        score_nodes<0>(qr, cp + h * chs, cns, sp + h * shs, sns, N, G, D, o);
      }
    }
  });
  return out;
}
"""

_lock = threading.Lock()
_module = None
_failed = False


def _load():
    """The compiled module, or None when it cannot be built (logged once)."""
    global _module, _failed
    if _module is not None or _failed:  # settled: the scan asks at every layer, no lock needed
        return _module
    with _lock:
        if _module is None and not _failed:
            try:
                from torch.utils.cpp_extension import load_inline

                _ninja_on_path()

                _module = load_inline(
                    name=f"arbor_sparse_native_{cpu_tag()}",  # -march=native: one build per kind of CPU
                    cpp_sources=_SOURCE,
                    functions=["gather_attend", "centroid_scores"],
                    extra_cflags=["-O3", "-march=native", "-ffast-math"],  # vector exp and sums; no infinities used
                    verbose=False,
                )
            except Exception as err:  # no compiler, no headers: the torch path stays
                _failed = True
                log.warning("sparse native kernel unavailable (%s); using the torch gather", err)
        return _module


def cpu_tag() -> str:
    """A short hash of this CPU's model and instruction-set flags: the kernels are built for the CPU they run
    on (``-march=native``), so a cache shared across machines (a home directory on a cluster) keeps one
    build per kind of CPU instead of loading one that uses instructions this CPU lacks."""
    try:
        with open("/proc/cpuinfo") as info:
            lines = [ln for ln in info if ln.startswith(("model name", "flags"))][:2]
    except OSError:
        lines = []
    text = "".join(lines) or platform.processor() or platform.machine()
    return hashlib.sha1(text.encode()).hexdigest()[:10]


def _ninja_on_path() -> None:
    """torch builds with the ``ninja`` on PATH: the pip package's (a dependency) when none is there (a venv
    whose bin/ is not on PATH)."""
    if shutil.which("ninja") is not None:
        return
    try:
        import ninja
    except ImportError:
        return
    os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")


def warm() -> bool:
    """Build or load the kernels now, before timed work (a benchmark's first step would pay for it);
    whether they are there (False when switched off or when they do not build)."""
    return enabled() and _load() is not None


def enabled() -> bool:
    """Whether the kernels may be used at all (``ARBOR_NATIVE`` not 0, false, off or no)."""
    return os.environ.get("ARBOR_NATIVE", "1").strip().lower() not in ("0", "false", "off", "no")


def available(pool) -> bool:
    """Whether :func:`gather_attend` serves ``pool``: on CPU, float32, enabled, and the kernel builds."""
    if not enabled() or pool.device.type != "cpu" or pool.shape.dtype != torch.float32:
        return False
    return _load() is not None


def scores_available(codes: torch.Tensor, scales: torch.Tensor | None, q: torch.Tensor) -> bool:
    """Whether :func:`centroid_scores` serves these: int8 codes with float16 scales and float32 queries on
    CPU, enabled, and the kernel builds."""
    if scales is None or codes.dtype != torch.int8 or q.dtype != torch.float32 or q.device.type != "cpu":
        return False
    return enabled() and _load() is not None


def centroid_scores(codes: torch.Tensor, scales: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Every node's centroid score (the flat scan): max over each KV head's query heads of q . code, times
    the node's scale, without the (H, N, D) float32 table.

    Args:
        codes: (H, N, D) int8; scales: (H, N) float16 (positive); q: (r, H, g, D) float32.
    Returns:
        (r, H, N) float32.
    """
    return _load().centroid_scores(codes, scales, q.contiguous())


def gather_attend(pool, layer: int, q: torch.Tensor, slots: torch.Tensor, valid: torch.Tensor, scale: float):
    """softmax(scale q.k) v over the keys and values at ``slots`` of ``layer``, read in the pool.

    Args:
        q: (R, H, g, D) float32 queries grouped by KV head.
        slots: (R, H, S) int64 pool slots; valid: (R, H, S) bool, which are read (at least one per
            row and head, else that row's output is 0).
    Returns:
        (R, H, g, D) float32.
    """
    arenas = pool.arenas
    return _load().gather_attend(
        q.contiguous(),
        [a.keys[layer] for a in arenas],
        [a.values[layer] for a in arenas],
        [int(a.base) for a in arenas],
        slots,
        valid,
        float(scale),
    )
