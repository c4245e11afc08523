"""Twenty Triton row-softmax candidates for the throughput benchmark: what a search's early
generations look like (block sizes, warp counts, one-pass and online two-pass forms), some fast and
some slow, all correct."""

from __future__ import annotations

from pathlib import Path

ONE_PASS = """
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def softmax_kernel(x_ptr, y_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * n_cols + offs, mask=mask, other=-float("inf"))
    x = x - tl.max(x, axis=0)
    e = tl.exp(x)
    tl.store(y_ptr + row * n_cols + offs, e / tl.sum(e, axis=0), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        softmax_kernel[(x.shape[0],)](x, y, x.shape[1], BLOCK=triton.next_power_of_2(x.shape[1]), num_warps=WARPS)
        return y
"""

ONLINE = """
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def softmax_kernel(x_ptr, y_ptr, n_cols: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    base = x_ptr + row * n_cols
    m_i = tl.full([BLOCK], -float("inf"), tl.float32)
    l_i = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n_cols, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(base + offs, mask=offs < n_cols, other=-float("inf"))
        m_new = tl.maximum(m_i, x)
        alpha = tl.where(m_i == m_new, 1.0, tl.exp(m_i - m_new))
        l_i = l_i * alpha + tl.where(x == -float("inf"), 0.0, tl.exp(x - m_new))
        m_i = m_new
    m = tl.max(m_i, axis=0)
    l = tl.sum(tl.where(m_i == -float("inf"), 0.0, l_i * tl.exp(m_i - m)), axis=0)
    inv = 1.0 / l
    for start in range(0, n_cols, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < n_cols
        x = tl.load(base + offs, mask=mask, other=-float("inf"))
        tl.store(y_ptr + row * n_cols + offs, tl.exp(x - m) * inv, mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        softmax_kernel[(x.shape[0],)](x, y, x.shape[1], BLOCK=BLOCKSIZE, num_warps=WARPS)
        return y
"""


def variants() -> dict[str, str]:
    out = {}
    for warps in (1, 2, 4, 8, 16):
        out[f"onepass_w{warps}"] = ONE_PASS.replace("WARPS", str(warps))
    for block in (256, 512, 1024, 2048, 4096):
        for warps in (2, 4, 8):
            out[f"online_b{block}_w{warps}"] = ONLINE.replace("BLOCKSIZE", str(block)).replace(
                "WARPS", str(warps)
            )
    return out


def write(directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, source in variants().items():
        path = directory / f"{name}.py"
        path.write_text(source)
        paths.append(path)
    return paths
