"""The CUDA paths of local (and full) encoder attention, chosen by
:func:`lib.model.local_attention.attention_path`: ``flash`` (FlashAttention-2 with a sliding window, in
the varlen layout the encoder packs once: :class:`Packing`, :func:`packed_attention`) and ``sdpa_band``
(SDPA with a band and key-padding mask: fp32, the padded layout, and the fallback when the FA2 op is
missing or refuses: :func:`sdpa_band_attention`). Exact, tested against the blocked CPU kernel."""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from lib.model.local_attention import _check_window, band_mask


#: The FA2 op; a module attribute so that tests can put a pure-PyTorch stand-in of the same signature in
#: its place (tests/model/test_attention_paths.py). None when this torch has no such op.
_flash_forward = getattr(torch.ops.aten, "_flash_attention_forward", None)
#: Keyword arguments the glue passes by name: a torch that renames them fails tests/model's schema test.
FLASH_SCHEMA_ARGS = ("cum_seq_q", "cum_seq_k", "max_q", "max_k", "dropout_p", "is_causal", "scale",
                     "window_size_left", "window_size_right")
_flash_refused: str | None = None  # why the op refused once (then "sdpa_band" for the rest of the process)


def flash_supported(device: torch.device) -> bool:
    """Whether the FA2 op can serve ``device``: a CUDA device of compute capability >= 8.0, a torch with
    the op and FlashAttention built in, and no refusal seen in this process (:func:`flash_refused`)."""
    if device.type != "cuda" or _flash_forward is None or _flash_refused is not None:
        return False
    try:
        if not torch.backends.cuda.is_flash_attention_available():
            return False
        return torch.cuda.get_device_capability(device) >= (8, 0)
    except (AttributeError, RuntimeError, AssertionError):
        return False


def flash_refused(reason: str) -> None:
    """Record that the FA2 op refused (``reason``): warn once, and use ``sdpa_band`` from now on."""
    global _flash_refused
    if _flash_refused is None:
        warnings.warn(f"FlashAttention-2 (torch.ops.aten._flash_attention_forward) refused: {reason}; local and "
                      "full encoder attention fall back to SDPA with a band mask (exact, slower)", RuntimeWarning,
                      stacklevel=3)
    _flash_refused = reason


def _band_allowed(n: int, window: int | None, key_padding_mask: Tensor | None, device) -> Tensor | None:
    """(B or 1, 1, N, N) bool, True = attend: |i - j| <= (w - 1) / 2 (no band for ``window`` None) and
    key j not padding. None when nothing is masked."""
    allowed = band_mask(n, window, device=device)[None, None] if window is not None and window < 2 * n - 1 else None
    if key_padding_mask is not None:
        keep = (~key_padding_mask.to(device=device, dtype=torch.bool))[:, None, None, :]  # (B, 1, 1, N)
        allowed = keep if allowed is None else allowed & keep
    return allowed


def sdpa_band_attention(q: Tensor, k: Tensor, v: Tensor, window: int | None, key_padding_mask: Tensor | None = None,
                        *, dropout_p: float = 0.0, training: bool = False) -> Tensor:
    """Local attention by ``F.scaled_dot_product_attention`` with a band AND key-padding boolean mask.

    q, k, v: (B, H, N, dh); ``window`` odd (None: full attention). Exact: query i attends the non-padding
    keys j with |i - j| <= (w - 1) / 2, scale 1/sqrt(dh). A query whose band holds no valid key gets a
    zero output and no gradient (the blocked kernel's convention; SDPA alone would give NaN). O(N^2)
    mask memory, one bool per (b, i, j). On CUDA the masked kernel is as fast as full SDPA (1.03-1.05x in
    fp32 at the shapes above), but building the mask costs about as much again (1.2-2.0x in all;
    docs/gpu.md): it serves fp32 and the fallback of the packed FA2 path, where nothing faster is exact."""
    if window is not None:
        window = _check_window(window)
    p = float(dropout_p) if training else 0.0
    B, H, N, dh = q.shape
    if N == 0:
        return q.new_zeros((B, H, 0, dh))
    k, v = k.to(q.dtype), v.to(q.dtype)
    allowed = _band_allowed(N, window, key_padding_mask, q.device)
    if allowed is None:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=p)
    row_ok = allowed.any(-1, keepdim=True)  # (B|1, 1, N, 1): the query has a key to attend
    # rows without one attend everywhere (finite), and their output is zeroed below
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed | ~row_ok, dropout_p=p)
    return out * row_ok.to(out.dtype)


@dataclass
class Packing:
    """The varlen layout of a padded batch (B, N): the valid rows of every sequence end to end.

    ``index`` (T,) long: flat row b * N + i of each packed row, on the device; ``cu_seqlens`` (B + 1,)
    int32 cumulative lengths, on the device; ``lengths`` the B lengths on the host (so packing needs no
    device sync); ``max_len`` their maximum; ``path`` what :func:`attention_path` chose for the
    encoder's attention in this layout ("flash", or "sdpa_band" after a refusal).
    """

    index: Tensor
    cu_seqlens: Tensor
    lengths: list[int]
    batch: int
    n: int
    path: str = "flash"

    @property
    def max_len(self) -> int:
        return max(self.lengths, default=0)

    @property
    def total(self) -> int:
        return int(self.index.numel())

    @staticmethod
    def build(lengths: list[int], n: int, device: torch.device, path: str = "flash") -> "Packing":
        """From the host ``lengths`` (each <= ``n``): index and cumulative lengths built on the CPU and
        copied to ``device`` (no device sync)."""
        lens = torch.tensor([int(x) for x in lengths], dtype=torch.long)
        if len(lens) and (int(lens.min()) < 0 or int(lens.max()) > n):
            raise ValueError(f"packing: lengths {lengths} must lie in [0, {n}]")
        valid = torch.arange(n)[None, :] < lens[:, None]  # (B, N)
        index = valid.reshape(-1).nonzero().squeeze(1)  # (T,)
        cu = torch.zeros(len(lens) + 1, dtype=torch.int32)
        cu[1:] = torch.cumsum(lens, 0).to(torch.int32)
        non_blocking = device.type == "cuda"
        return Packing(index.to(device, non_blocking=non_blocking), cu.to(device, non_blocking=non_blocking),
                       [int(x) for x in lengths], len(lens), n, path)

    def pack(self, x: Tensor) -> Tensor:
        """(B, N, ...) -> (T, ...): the valid rows."""
        return x.reshape(self.batch * self.n, *x.shape[2:]).index_select(0, self.index)

    def unpack(self, x: Tensor) -> Tensor:
        """(T, ...) -> (B, N, ...), zeros on padding."""
        out = x.new_zeros((self.batch * self.n, *x.shape[1:]))
        return out.index_copy(0, self.index, x).view(self.batch, self.n, *x.shape[1:])

    def padding_mask(self, device) -> Tensor:
        """(B, N) bool, True = padding (built on the host, copied)."""
        lens = torch.tensor(self.lengths, dtype=torch.long)
        mask = torch.arange(self.n)[None, :] >= lens[:, None]
        return mask.to(device, non_blocking=torch.device(device).type == "cuda")


def packed_attention(q: Tensor, k: Tensor, v: Tensor, packing: Packing, window: int | None, *,
                     dropout_p: float = 0.0, training: bool = False) -> Tensor:
    """Local (``window`` odd) or full (``window`` None) attention on packed q, k, v (T, H, dh) -> (T, H, dh).

    ``packing.path == "flash"``: one call of the FA2 op over all sequences (cumulative lengths, window
    (w - 1) / 2 to either side, dropout through the op). If the op refuses (RuntimeError: an unsupported
    card, dtype or head size), :func:`flash_refused` warns once and this call and every later one takes
    ``sdpa_band`` on the unpacked tensors, packed back. Exact either way."""
    p = float(dropout_p) if training else 0.0
    T, H, dh = q.shape
    if window is not None:
        window = _check_window(window)
    if packing.path == "flash" and _flash_refused is None and _flash_forward is not None:
        half = -1 if window is None else (window - 1) // 2
        try:
            out = _flash_forward(q, k.to(q.dtype), v.to(q.dtype), packing.cu_seqlens, packing.cu_seqlens,
                                 packing.max_len, packing.max_len, p, False, False, scale=dh ** -0.5,
                                 window_size_left=half, window_size_right=half)[0]
            return out
        except RuntimeError as e:  # e.g. "FlashAttention only supports Ampere GPUs or newer"
            flash_refused(str(e).splitlines()[0] if str(e) else type(e).__name__)
    packing.path = "sdpa_band"

    def unpack(t: Tensor) -> Tensor:  # (T, H, dh) -> (B, H, N, dh)
        return packing.unpack(t).transpose(1, 2)

    out = sdpa_band_attention(unpack(q), unpack(k), unpack(v), window, packing.padding_mask(q.device),
                              dropout_p=p, training=p > 0)  # (B, H, N, dh)
    return packing.pack(out.transpose(1, 2))
