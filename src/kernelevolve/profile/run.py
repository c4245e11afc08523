"""Profile one candidate at one shape, in separate sandboxed processes, and return the metrics.

`profile_candidate` runs `profile/target.py` under torch.profiler (kernel count, per-kernel time,
launch overhead) and, on an NVIDIA GPU with `ncu` installed, once more under Nsight Compute with the
fixed metric set of `profile/ncu.py`, filtered to the candidate's NVTX range. Each process gets the
evaluation workers' scrubbed environment (no secrets, a private HOME and caches), an address-space
limit where the platform allows one, the workers' sandbox (`evaluate/confined_exec.py`: namespaces
of its own, an empty network namespace with only its own loopback up, reads and writes confined), and
a wall-clock limit after which its process group is killed. The profiled process takes the device's
lease itself once its imports are done, so that only its device work waits for (and keeps waiting)
the evaluations being timed.

What comes back is a plain dict: `profiler` (torch.profiler's summary or None), `ncu` (per-kernel
metrics and their summary, or None), `tools` (what ran) and `errors` (what did not, and why): the
caller degrades to what it has. Deliberately not here: judging the numbers (`profile/diagnosis.py`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import kernelevolve
from kernelevolve.config import Settings
from kernelevolve.evaluate.lease import lease_dir
from kernelevolve.evaluate.sandbox import kill_tree, sandbox_argv, scrub_env
from kernelevolve.platforms.base import Platform
from kernelevolve.profile import ncu
from kernelevolve.spec import Spec


def heaviest_shape(spec: Spec) -> str:
    """The shape with the largest weight x footprint: where the time of a production mix goes."""
    return max(spec.shapes, key=lambda s: (s.weight * (spec.footprint_bytes(s.name) or 1), s.name)).name


def profile_candidate(
    spec: Spec, platform: Platform, source: str, settings: Settings, shape: str | None = None,
    mode: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Profile `source` at `shape` (default: the heaviest). `mode` overrides `settings.profile`."""
    mode = mode or settings.profile
    if mode == "auto" and platform.name not in ("cuda", "rocm"):
        mode = "torch"  # an explicit request on the CPU: torch.profiler is what there is
    shape = shape or heaviest_shape(spec)
    spec.shape(shape)  # an unknown name fails here, with the spec's error
    # device_s: per tool, the seconds its process held the device's lease (what a profile costs the
    # evaluations waiting for it)
    out: dict[str, Any] = {"shape": shape, "profiler": None, "ncu": None, "tools": [], "errors": [],
                           "device_s": {}}  # fmt: skip
    if mode == "off":
        return out
    gpu = platform.name in ("cuda", "rocm")
    device = platform.device_string(settings.device) if gpu else "cpu"
    with tempfile.TemporaryDirectory(prefix="kernelevolve-profile-") as tmp:
        work = Path(tmp)
        cand = work / "candidate.py"
        cand.write_text(source)
        if mode in ("auto", "torch"):
            res = _target(spec, cand, shape, device, "torch", work, platform, settings)
            if res.get("ok"):
                out["profiler"] = res["profiler"] | {"wall_us_per_call": res.get("wall_us_per_call")}
                out["tools"].append("torch.profiler")
                out["device_s"]["torch.profiler"] = res.get("device_s")
            else:
                out["errors"].append(f"torch.profiler: {res.get('error')}")
        if mode in ("auto", "ncu") and platform.name == "cuda":
            exe = ncu.find_ncu()
            if exe is None:
                out["errors"].append(
                    "ncu: not installed here (Nsight Compute); the roofline and torch.profiler remain"
                )
            else:
                out["ncu"], err = _ncu(spec, cand, shape, device, work, platform, settings, exe)
                if err:
                    out["errors"].append(f"ncu: {err}")
                else:
                    out["tools"].append("ncu")
                    out["device_s"]["ncu"] = out["ncu"]["device_s"]
        elif mode == "ncu":
            out["errors"].append(f"ncu: profiles NVIDIA GPUs only, not platform {platform.name!r}")
        notes = work / "sandbox-notes.txt"
        if notes.is_file():
            out["errors"] += [f"sandbox: {n}" for n in dict.fromkeys(notes.read_text().splitlines())]
    return out


def _env(work: Path, platform: Platform) -> dict[str, str]:
    env = scrub_env(dict(os.environ), work)
    env.update(platform.worker_env())
    (work / "tmp").mkdir(exist_ok=True)
    env["TRITON_CACHE_DIR"] = str(work / "triton")
    env["KERNELEVOLVE_NATIVE_CACHE"] = str(work / "native")
    env["KERNELEVOLVE_LEASE_DIR"] = str(lease_dir())  # shared by all; the process's TMPDIR is its own
    src_root = str(Path(kernelevolve.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src_root, env.get("PYTHONPATH", "")) if p)
    return env


def _argv(spec: Spec, cand: Path, shape: str, device: str, mode: str, result: Path, platform: Platform,
          settings: Settings) -> list[str]:  # fmt: skip
    """The profiled process's command; it takes the device's lease itself, once its imports are done
    (`profile/target.py`), and holds it until it ends. Where work may run beside a timing (a GPU; not
    the CPU, `Platform.exclusive`), it first builds the inputs and makes the candidate's first call."""
    argv = [sys.executable, "-m", "kernelevolve.profile.target", str(spec.path.resolve()), str(cand),
            "--shape", shape, "--device", device, "--mode", mode, "--out", str(result),
            "--lease", platform.lease_key(settings.device)]  # fmt: skip
    return argv if platform.exclusive else [*argv, "--warm-before-lease"]


def _spawn(
    argv: list[str], work: Path, platform: Platform, settings: Settings, reads: list[Path]
) -> tuple[int | None, str, str]:
    """(exit code or None on timeout, stdout, stderr tail). `argv` runs inside the workers' sandbox
    and limits (`evaluate/confined_exec.py`), which may also read `reads`."""
    confined = [
        sys.executable,
        "-m",
        "kernelevolve.evaluate.confined_exec",
        *sandbox_argv(work, settings, reads),
    ]
    confined += ["--memory-bytes", str(int(settings.memory_limit_gb * 2**30))]
    confined += ["--cpu-seconds", str(int(settings.profile_timeout_s * 4)), "--file-bytes", str(2**30)]
    return _communicate([*confined, "--", *argv], work, platform, settings)


def _communicate(
    argv: list[str], work: Path, platform: Platform, settings: Settings
) -> tuple[int | None, str, str]:
    proc = subprocess.Popen(
        argv, cwd=work, env=_env(work, platform), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        stdout, stderr = proc.communicate(timeout=settings.profile_timeout_s)
        return proc.returncode, stdout, stderr[-2000:]
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)
        proc.kill()
        proc.communicate()
        return None, "", f"timed out after {settings.profile_timeout_s:.0f} s"


def _target(spec: Spec, cand: Path, shape: str, device: str, mode: str, work: Path, platform: Platform,
            settings: Settings) -> dict[str, Any]:  # fmt: skip
    result = work / f"result-{mode}.json"
    argv = _argv(spec, cand, shape, device, mode, result, platform, settings)
    code, _, err = _spawn(argv, work, platform, settings, [spec.path])
    if result.is_file():
        data: dict[str, Any] = json.loads(result.read_text())
        return data
    return {"ok": False, "error": err.strip().splitlines()[-1] if err.strip() else f"exit code {code}"}


def _ncu(spec: Spec, cand: Path, shape: str, device: str, work: Path, platform: Platform, settings: Settings,
         exe: str) -> tuple[dict[str, Any] | None, str | None]:  # fmt: skip
    result = work / "result-ncu.json"
    start = time.perf_counter()
    argv = ncu.command(_argv(spec, cand, shape, device, "ncu", result, platform, settings), ncu=exe)
    toolkit = Path(exe).resolve().parent.parent  # ncu's own folder: its libraries and sections
    code, stdout, err = _spawn(argv, work, platform, settings, [spec.path, toolkit])
    if code is None:
        return None, err
    if result.is_file() and not json.loads(result.read_text()).get("ok"):
        return None, "the candidate failed under ncu: " + str(json.loads(result.read_text()).get("error"))
    try:
        kernels = [k for k in ncu.parse_csv(stdout) if not ncu.is_helper(k.name)]
    except Exception as exc:
        return None, f"{exc} {err[-300:]}".strip()
    if not kernels:
        return None, "ncu saw no kernel in the candidate's range (is the candidate a CUDA kernel at all?)"
    done = json.loads(result.read_text()) if result.is_file() else {}
    return {
        "kernels": [k.to_dict() for k in kernels],
        "summary": ncu.summarize(kernels),
        "seconds": round(time.perf_counter() - start, 2),
        "device_s": done.get("device_s"),  # of those seconds, the device's lease held
    }, None


__all__ = ["heaviest_shape", "profile_candidate"]
