"""The knowledge base's C samples (`knowledge/docs/samples/c/<op>.py`): each is a CPU candidate for its
spec (`samples/specs/<op>.py`) and must stay one.

- Harness: every sample goes through the real evaluator on the CPU platform (static guards, native
  build, correctness at every shape x seed x distribution, timing against eager) and must be `ok`.
- Static: TUNABLES/CONFIG are well formed, the tuner can rewrite CONFIG, and the source passes the
  pool's static guards as a C kernel.
- Documents: each `c-<op>.md` is a sample document that points at its spec and kernel.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import kernelevolve
from kernelevolve.evaluate import EvaluatorPool, Status
from kernelevolve.evaluate.pool import static_report
from kernelevolve.knowledge.docs import doc_from_text
from kernelevolve.platforms import get_platform
from kernelevolve.spec import load_spec
from kernelevolve.synth.tuner import tunables
from tests.conftest import cpu_settings

SAMPLES_DIR = Path(kernelevolve.__file__).parent / "knowledge" / "docs" / "samples"
OPS = [
    "bias_gelu",
    "softmax",
    "rmsnorm",
    "linear_relu",
    "bmm",
    "conv2d",
    "attention",
    "embedding_bag",
    "bucketize",
]
PATTERNS = {
    "elementwise",
    "row",
    "gemm",
    "batched-gemm",
    "conv",
    "attention",
    "gather",
    "jagged",
    "bucketize",
}


def _kernel(op: str) -> Path:
    return SAMPLES_DIR / "c" / f"{op}.py"


def _spec(op: str) -> Path:
    return SAMPLES_DIR / "specs" / f"{op}.py"


# -- the real harness -------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(600)  # workers wait for the machine-wide CPU lease, which other runs may hold
@pytest.mark.parametrize("op", OPS)
def test_sample_is_ok_through_the_cpu_harness(op: str, tmp_path: Path) -> None:
    spec = load_spec(_spec(op))
    # spares=0: no replacement worker is started (and killed) after the one evaluation
    with EvaluatorPool(spec, get_platform("cpu"), cpu_settings(tmp_path, spares=0)) as pool:
        v = pool.evaluate_one(_kernel(op).read_text(), "sample.py")
    assert v.status == Status.OK, f"{op}: {v.status} {v.message}\n{v.log_tail or ''}"
    assert v.correct is True
    assert v.candidate_kind == "c"
    assert v.timed is True
    assert {s.name for s in v.shapes} == {s.name for s in spec.shapes}
    assert all(s.correct for s in v.shapes)
    verdict = v.to_dict()
    assert verdict["speedup_vs_eager"] is not None and verdict["speedup_vs_eager"] > 0
    per_shape = ", ".join(f"{s.name} {s.speedup_vs_eager:.2f}x" for s in v.shapes if s.speedup_vs_eager)
    print(f"{op}: speedup_vs_eager {verdict['speedup_vs_eager']:.2f} ({per_shape})")


# -- static -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("op", OPS)
def test_sample_declares_tunables_and_passes_guards(op: str) -> None:
    source = _kernel(op).read_text()
    declared = tunables.read(source)
    assert declared is not None, "no TUNABLES/CONFIG"
    choices, config = declared
    assert set(choices) == set(config)
    other = {k: v[0] for k, v in choices.items()}  # the tuner can rewrite CONFIG in place
    assert tunables.read(tunables.write(source, other)) == (choices, other)
    report = static_report(source, load_spec(_spec(op)), get_platform("cpu"))
    assert report.ok, (report.syntax_error, report.violations)
    assert report.kinds == {"c"}


# -- documents --------------------------------------------------------------------------------------


def _front_matter(text: str) -> dict[str, str]:
    lines = text.splitlines()
    assert lines[0] == "---", "no front matter"
    end = lines.index("---", 1)
    return dict(line.split(": ", 1) for line in lines[1:end])


def _list(value: str) -> list[str]:
    assert value.startswith("[") and value.endswith("]"), value
    return [v.strip().strip('"') for v in value[1:-1].split(",")]


@pytest.mark.parametrize("op", OPS)
def test_sample_document_points_at_its_files(op: str) -> None:
    text = (SAMPLES_DIR / f"c-{op}.md").read_text()
    meta = _front_matter(text)
    assert meta["category"] == "sample"
    assert _list(meta["platforms"]) == ["cpu"]
    assert meta["spec"] == f"specs/{op}.py" and (SAMPLES_DIR / meta["spec"]).is_file()
    assert meta["kernel"] == f"c/{op}.py" and (SAMPLES_DIR / meta["kernel"]).is_file()
    assert set(_list(meta["triggers"])) & PATTERNS, "no operator-pattern trigger"
    body = text.split("\n---\n", 1)[1]
    assert 120 <= len(body.split()) <= 400
    doc = doc_from_text(text, f"samples/c-{op}", f"samples/c-{op}.md", "builtin")  # the index's own parser
    assert doc.category == "sample" and doc.platforms == ["cpu"]
    assert doc.meta == {"spec": meta["spec"], "kernel": meta["kernel"]}
