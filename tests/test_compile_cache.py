"""The Triton part of the trusted compile cache (compile_cache.py): a copied cache whose group files
still load in Triton's own cache manager, and kernels a later worker compiled added to the trusted
cache without replacing what it holds."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kernelevolve.evaluate.compile_cache import merge_new, relocate_groups

KEY = "6AJZPGNK37VB6W5CPEL7YIH24SUQJEIDUUAB7UIPUX4CWRC56TXQ"
FILES = ("k.cubin", "k.json", "k.ptx")


def _kernel(triton_dir: Path, key: str = KEY, body: bytes = b"cubin") -> Path:
    """A kernel's folder as Triton writes it: its files and a group naming them by absolute path."""
    folder = triton_dir / key
    folder.mkdir(parents=True)
    for name in FILES:
        (folder / name).write_bytes(body)
    group = {"child_paths": {name: str(folder / name) for name in FILES}}
    (folder / "__grp__k.json").write_text(json.dumps(group))
    return folder


def test_a_copied_cache_loads_in_tritons_cache_manager(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    triton = pytest.importorskip("triton")
    from triton.runtime.cache import FileCacheManager

    first = tmp_path / "worker-a" / "inductor" / "triton"
    _kernel(first)
    copy = tmp_path / "worker-b" / "inductor" / "triton"
    shutil.copytree(first.parent, copy.parent)
    shutil.rmtree(tmp_path / "worker-a")  # the worker that wrote it is gone, as it is in a run
    monkeypatch.setenv("TRITON_CACHE_DIR", str(copy))
    assert FileCacheManager(KEY).get_group("k.json") is None  # as copied: the group names the old worker
    assert relocate_groups(copy) == 1
    group = FileCacheManager(KEY).get_group("k.json")
    assert group == {name: str(copy / KEY / name) for name in FILES}, triton.__version__
    assert relocate_groups(copy) == 0  # already pointing home


def test_new_kernels_are_added_and_entries_already_trusted_are_never_replaced(tmp_path: Path) -> None:
    trusted = tmp_path / "trusted" / "triton"
    _kernel(trusted, body=b"trusted")
    worker = tmp_path / "worker" / "triton"
    _kernel(worker, body=b"the worker's")  # same key, other bytes: the trusted one stays
    _kernel(worker, key="HFNR75CCYFYMGYBGPICBVRUZWPBZEYLRAYIUBXAWRIF3TXA4QCEQ")
    (worker / "stray-file").write_text("not a kernel folder")
    assert merge_new(worker, trusted) == 1
    assert (trusted / KEY / "k.cubin").read_bytes() == b"trusted"
    assert sorted(p.name for p in trusted.iterdir()) == sorted(
        [KEY, "HFNR75CCYFYMGYBGPICBVRUZWPBZEYLRAYIUBXAWRIF3TXA4QCEQ"]
    )
    assert merge_new(worker, trusted) == 0
