"""Every code sample in the knowledge base, statically: its declared tunables are well formed and
rewritable by the tuner, its source passes the static guards of its platform as its own kind, and its
document points at its spec and kernel and names its operator pattern. Whether each sample is correct
(and timed) is in `test_kb_samples_c.py` (the CPU harness) and `test_kb_samples_triton.py` (the Triton
interpreter here, the CUDA harness on a GPU)."""

from __future__ import annotations

import pytest

from kernelevolve import tunables
from kernelevolve.evaluate.pool import static_report
from kernelevolve.knowledge.docs import doc_from_text
from kernelevolve.knowledge.patterns import spec_pattern
from kernelevolve.platforms import get_platform
from kernelevolve.spec import load_spec

from .kb_samples import KINDS, OPS, SAMPLES_DIR, kernel, ops_of, spec

CASES = [(kind, op) for kind in KINDS for op in ops_of(kind)]
DOC_PLATFORMS = {"c": ["cpu"], "triton": ["cuda", "rocm"]}
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


def test_every_op_has_a_triton_sample_and_every_sample_a_spec() -> None:
    assert len(OPS) >= 9
    assert ops_of("triton") == OPS
    for kind in KINDS:
        assert set(ops_of(kind)) <= set(OPS), kind
        assert sorted(
            p.name.removeprefix(f"{kind}-").removesuffix(".md") for p in SAMPLES_DIR.glob(f"{kind}-*.md")
        ) == ops_of(kind)


@pytest.mark.parametrize(("kind", "op"), CASES)
def test_sample_declares_tunables_and_passes_guards(kind: str, op: str) -> None:
    source = kernel(kind, op).read_text()
    declared = tunables.read(source)
    assert declared is not None, "no TUNABLES/CONFIG"
    choices, config = declared
    assert set(choices) == set(config)
    other = {k: v[0] for k, v in choices.items()}  # the tuner can rewrite CONFIG in place
    assert tunables.read(tunables.write(source, other)) == (choices, other)
    report = static_report(source, load_spec(spec(op)), get_platform(KINDS[kind]))
    assert report.ok, (report.syntax_error, report.violations)
    assert report.kinds == {kind}


@pytest.mark.parametrize(("kind", "op"), CASES)
def test_sample_document_points_at_its_files(kind: str, op: str) -> None:
    path = SAMPLES_DIR / f"{kind}-{op}.md"
    doc = doc_from_text(path.read_text(), f"samples/{kind}-{op}", str(path), "builtin")  # the index's parser
    assert doc.category == "sample" and doc.platforms == DOC_PLATFORMS[kind]
    assert doc.meta == {"spec": f"specs/{op}.py", "kernel": f"{kind}/{op}.py"}
    assert doc.title and doc.tags
    assert set(doc.triggers) & PATTERNS, "no operator-pattern trigger"
    pattern = spec_pattern(load_spec(spec(op)))
    assert pattern in doc.triggers or {"gather": "jagged"}.get(pattern) in doc.triggers, (
        pattern,
        doc.triggers,
    )
    assert 120 <= len(doc.body.split()) <= 400, len(doc.body.split())
