"""The knowledge base: document format, the shipped documents, retrieval by runtime signals, injection
of a new platform's documents, hybrid ranking, skills (distill, merge, verify), warm-start seeds,
context memory, operator patterns, and the diagnosis on synthetic profiles."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from kernelevolve.knowledge import skills as sk
from kernelevolve.knowledge.docs import DOCS_DIR, Doc, DocError, builtin_docs, chunk_text, parse
from kernelevolve.knowledge.index import KnowledgeBase, Signals, register_embedder
from kernelevolve.knowledge.patterns import classify, spec_pattern
from kernelevolve.profile.diagnosis import diagnose
from kernelevolve.search import learning
from kernelevolve.search.tree import Node, Tree
from kernelevolve.spec import load_spec
from kernelevolve.store import Workspace

SAMPLE_SPECS = DOCS_DIR / "samples" / "specs"


@pytest.fixture
def kb(tmp_path: Path) -> KnowledgeBase:
    return KnowledgeBase(Workspace.open(tmp_path / "ws"))


# -- the format -------------------------------------------------------------------------------------


def test_front_matter_parses_lists_quotes_and_refuses_bad_lines() -> None:
    meta, body = parse(
        '---\ntitle: A: b\ntags: [x, Y, "c, d"]\ntriggers: ["out of resources", row]\n---\n# H\ntext'
    )
    assert meta == {"title": "A: b", "tags": ["x", "y", "c, d"], "triggers": ["out of resources", "row"]}
    assert body == "# H\ntext"
    assert parse("no front matter") == ({}, "no front matter")
    with pytest.raises(DocError, match="never closed"):
        parse("---\ntitle: x\n")
    with pytest.raises(DocError, match="key: value"):
        parse("---\njust words\n---\n")


def test_chunking_splits_at_headings_and_long_sections() -> None:
    text = "# A\n" + "\n\n".join(["word " * 100] * 5) + "\n## B\nshort"
    pieces = list(chunk_text(text, max_words=250))
    assert [h for h, _ in pieces] == ["A", "A", "A", "B"]
    assert all(len(p.split()) <= 250 for _, p in pieces)


# -- the shipped documents ----------------------------------------------------------------------------


def test_shipped_documents_are_many_specific_and_well_formed() -> None:
    docs = builtin_docs()
    assert len(docs) >= 40, len(docs)
    by_cat: dict[str, int] = {}
    for d in docs:
        by_cat[d.category] = by_cat.get(d.category, 0) + 1
        assert d.title and d.title != d.id, d.id
        assert set(d.platforms) <= {"cuda", "rocm", "cpu", "any"} and d.platforms, d.id
        words = len(d.body.split())
        assert words >= 100, f"{d.id}: {words} words"
        if d.category in ("hardware", "guidance"):
            assert re.search(r"\d", d.body), f"{d.id}: no numbers at all"
    assert by_cat.get("constraint", 0) >= 5 and by_cat.get("guidance", 0) >= 8
    assert by_cat.get("hardware", 0) >= 10 and by_cat.get("sample", 0) >= 16
    archs = {d.id.split("/")[1] for d in docs if d.category == "hardware"}
    assert {"hopper", "ampere", "cdna3", "x86-64"} <= archs
    samples = [d for d in docs if d.category == "sample"]
    assert all("```python" in d.body and "class ModelNew" in d.body for d in samples)  # the kernel is in it


def test_index_is_built_once_and_rebuilt_when_the_documents_change(tmp_path: Path, monkeypatch: Any) -> None:
    ws = Workspace.open(tmp_path / "ws")
    kb = KnowledgeBase(ws)
    n = len(kb.docs())
    assert n == len(builtin_docs())
    digest = ws.kb_meta("builtin_digest")
    import kernelevolve.knowledge.index as index

    monkeypatch.setattr(index, "builtin_digest", lambda: "changed")
    monkeypatch.setattr(index, "builtin_docs", lambda: builtin_docs()[:3])
    assert len(KnowledgeBase(ws).docs()) == 3 and ws.kb_meta("builtin_digest") == "changed" != digest


# -- retrieval by signals -----------------------------------------------------------------------------

# (signals, the document that must be among the top 3). Written for these tests against the shipped
# documents; each names the situation a search step would be in.
CASES: list[tuple[Signals, str]] = [
    (
        Signals("cuda", "cuda:sm90", "row", "memory-bound", phase="early", text="softmax"),
        "guidance/row-reductions",
    ),
    (
        Signals(
            "cuda",
            "cuda:sm90",
            "gemm",
            "compute-bound",
            phase="late",
            text="bf16 linear layer on tensor cores",
        ),
        "hardware/hopper/tensor-cores-wgmma",
    ),
    (
        Signals(
            "cuda",
            "cuda:sm90",
            statuses=["guard_violation"],
            errors="[torch-compute] line 12: torch.matmul does the work",
            phase="early",
        ),
        "constraints/static-guards-compute",
    ),
    (
        Signals(
            "cuda",
            "cuda:sm90",
            statuses=["compile_error"],
            errors="ValueError: arange's range must be a power of 2",
        ),
        "guidance/triton-compile-errors",
    ),
    (
        Signals(
            "cuda",
            "cuda:sm90",
            statuses=["compile_error"],
            errors="triton.runtime.errors.OutOfResources: out of resources: shared memory, Required: 262144, Hardware limit: 232448",
        ),
        "guidance/triton-runtime-failures",
    ),
    (
        Signals(
            "cpu",
            "cpu:x86_64-avx2",
            statuses=["compile_error"],
            errors="error: expected ';' before '}' token gcc",
        ),
        "guidance/c-compiler-errors",
    ),
    (
        Signals("cuda", "cuda:sm90", "attention", phase="early", text="attention softmax(q k^T) v"),
        "samples/triton-attention",
    ),
    (Signals("cpu", "cpu:x86_64-avx512", "attention", text="attention"), "samples/c-attention"),
    (
        Signals("cuda", "cuda:sm90", "gather", phase="early", text="embedding bag sum pooling offsets"),
        "samples/triton-embedding_bag",
    ),
    (Signals("cpu", "cpu:x86_64", "bucketize", text="bucketize borders"), "samples/c-bucketize"),
    (Signals("cuda", "cuda:sm90", "conv", text="convolution 3x3"), "samples/triton-conv2d"),
    (Signals("cuda", "cuda:sm90", "batched-gemm", text="batched matrix multiply bmm"), "samples/triton-bmm"),
    (
        Signals(
            "cuda", "cuda:sm90", "elementwise", "launch-bound", phase="late", text="gelu bias small shapes"
        ),
        "guidance/launch-overhead-small-shapes",
    ),
    (
        Signals("cuda", "cuda:sm80", "gemm", "compute-bound", phase="late", text="tf32 mma cp.async A100"),
        "hardware/ampere/tensor-cores",
    ),
    (
        Signals("rocm", "rocm:gfx942", "row", phase="late", text="wavefront 64 num_warps MI300X"),
        "hardware/cdna3/wavefront64-triton",
    ),
    (
        Signals(
            "cpu",
            "cpu:x86_64-avx512",
            "elementwise",
            "memory-bound",
            phase="late",
            text="AVX-512 vectorize restrict",
        ),
        "hardware/x86-64/simd-vectorization",
    ),
    (
        Signals("cpu", "cpu:x86_64", "row", phase="late", text="OpenMP threads schedule false sharing"),
        "hardware/x86-64/openmp-threading",
    ),
    (
        Signals(
            "cuda",
            "cuda:sm90",
            statuses=["incorrect"],
            errors="max rel err 0.03 exceeds tolerance under strict_fp32; tl.dot tf32",
        ),
        "constraints/precision-policies",
    ),
    (
        Signals(
            "cuda", "cuda:sm90", statuses=["suspicious"], errors="speedup 40x above 10x flagged suspicious"
        ),
        "constraints/timing-method",
    ),
    (
        Signals(
            "cuda",
            "cuda:sm90",
            "gemm",
            "compute-bound",
            phase="late",
            text="GEMM tiles grouped ordering for L2, split-K",
        ),
        "guidance/gemm-fused-epilogues",
    ),
    (
        Signals("cuda", "cuda:sm90", "row", "occupancy-limited", phase="late", text="registers occupancy"),
        "hardware/hopper/occupancy",
    ),
    (
        Signals(
            "cuda",
            "cuda:sm90",
            "elementwise",
            "memory-bound",
            phase="early",
            text="coalesced vectorized loads",
        ),
        "guidance/coalescing-vectorized-access",
    ),
    (
        Signals(
            "cuda",
            "cuda:sm90",
            statuses=["incorrect"],
            errors="inputs changed: the candidate mutated its input in place",
        ),
        "constraints/runtime-correctness-checks",
    ),
    (
        Signals(
            "cuda",
            "cuda:sm90",
            "gemm",
            phase="late",
            text="TMA tensor descriptor warp specialization persistent",
        ),
        "hardware/hopper/tma-persistent-kernels",
    ),
]


def test_retrieval_top3_recall_is_at_least_90_percent(kb: KnowledgeBase) -> None:
    ids = set(kb.docs())
    missing = sorted({want for _, want in CASES if want not in ids})
    assert not missing, f"cases name documents that do not exist: {missing}"
    misses = []
    for signals, want in CASES:
        top = [h.doc.id for h in kb.retrieve(signals, limit=3)]
        if want not in top:
            misses.append((want, top))
    recall = 1 - len(misses) / len(CASES)
    assert len(CASES) >= 20 and recall >= 0.9, f"recall {recall:.2f}; misses: {misses}"


def test_retrieval_never_crosses_platforms(kb: KnowledgeBase) -> None:
    for text in ("softmax row reduction", "gemm tiles", "occupancy registers", "vectorize loads"):
        for hit in kb.retrieve(Signals("cpu", "cpu:x86_64", text=text), limit=8):
            assert hit.doc.applies_to("cpu"), hit.doc.id
        for hit in kb.retrieve(Signals("cuda", "cuda:sm90", text=text + " openmp"), limit=8):
            assert hit.doc.applies_to("cuda"), hit.doc.id


def test_progressive_specialization_moves_from_basics_to_depth(kb: KnowledgeBase) -> None:
    def levels(phase: str) -> list[str]:
        hits = kb.retrieve(
            Signals("cuda", "cuda:sm90", "row", "memory-bound", phase=phase, text="rmsnorm"), limit=5
        )
        return [h.doc.level for h in hits]

    assert levels("draft").count("basic") > levels("late").count("basic")


def test_free_text_search_and_garbage_queries(kb: KnowledgeBase) -> None:
    hits = kb.search("memory bound row reduction hopper", limit=5)
    assert hits and all(h.score > 0 for h in hits)
    kb.search('")(*&^ OR NEAR(', limit=3)  # FTS5 syntax in a query is searched for, never raised
    assert kb.search("zzzzqqqq", limit=3) == []


# -- injection of a platform nobody has seen ------------------------------------------------------------


NPU_DOCS = {
    "memory.md": "# Zephyr NPU v2 memory\n\nThe Zephyr v2 scratchpad holds 96 KiB per tile; DMA bursts of 512 bytes "
    "reach 1.2 TB/s. Double-buffer the scratchpad: while tile k computes, tile k+1 streams in.\n\n"
    "## Reductions\n\nRow reductions use the tile's 64-lane vector unit; reduce across lanes with vredsum, "
    "never through the scratchpad.",
    "errors.txt": "ZPU-E042 bank conflict: two lanes hit the same scratchpad bank; pad rows to 65 words.",
}


def test_injected_platform_documents_are_retrieved_and_reach_the_prompt(
    kb: KnowledgeBase, tmp_path: Path
) -> None:
    folder = tmp_path / "npu-manuals"
    folder.mkdir()
    for name, text in NPU_DOCS.items():
        (folder / name).write_text(text)
    added = kb.add(folder, "npu:v2")
    assert len(added) == 3 and {d.platforms[0] for d in added} == {"npu"} and added[0].targets == ["npu:v2"]
    assert len(kb.add(folder, "npu:v2")) == 3 and len(kb.listing("npu")) >= 3  # re-adding replaces
    assert len([d for d in kb.docs() if d.startswith("user/npu/")]) == 3
    signals = Signals("npu", "npu:v2", "row", "memory-bound", phase="late", text="row reduction scratchpad")
    top = kb.retrieve(signals, limit=3)
    assert top and top[0].doc.id.startswith("user/npu/memory"), [h.doc.id for h in top]
    err = kb.retrieve(
        Signals("npu", "npu:v2", statuses=["runtime_error"], errors="ZPU-E042 bank conflict"), limit=1
    )
    assert err[0].doc.id == "user/npu/errors#1"
    assert all(
        h.doc.applies_to("cuda") for h in kb.retrieve(Signals("cuda", text="scratchpad bank"), limit=5)
    )

    from kernelevolve.search.tools import snippet
    from kernelevolve.synth.base import Task
    from kernelevolve.synth.prompt import synthesize

    spec = load_spec(SAMPLE_SPECS / "softmax.py")
    task = Task(run_id="r", node_id=1, spec=spec, platform="npu", platform_target="npu:v2", kinds=("c",),
                mode="draft", knowledge=[snippet(h) for h in top], phase="late", pattern="row")  # fmt: skip
    _, user = synthesize(task, max_tokens=20_000, tool_mode=False)
    assert "96 KiB per tile" in user and "## Retrieved knowledge (npu:v2, row, late phase)" in user


def test_hybrid_ranking_uses_a_registered_embedder(tmp_path: Path) -> None:
    class Toy:
        """Embeds by topic words: enough to give a dense order unlike the lexical one."""

        name = "toy"

        def embed(self, texts: Any) -> list[list[float]]:
            def vec(t: str) -> list[float]:
                t = t.lower()
                return [1.0, 0.0] if "scratchpad" in t else [0.7, 0.7] if "tile" in t else [0.0, 1.0]

            return [vec(t) for t in texts]

    register_embedder("toy", lambda arg: Toy())
    from kernelevolve.knowledge.index import Hit, get_embedder

    ws = Workspace.open(tmp_path / "ws")
    hybrid = KnowledgeBase(ws, embedder=get_embedder("toy:"))
    a, b, c = (Doc(id=i, title=i, category="user", body=body) for i, body in
               (("a", "scratchpad"), ("b", "vector unit"), ("c", "tile loops")))  # fmt: skip
    lexical = [Hit(b, 3.0), Hit(a, 2.0), Hit(c, 1.0)]  # dense order: a, c, b
    fused = hybrid._hybrid(Signals("npu", text="scratchpad"), lexical)
    assert [h.doc.id for h in fused] == ["a", "b", "c"] and "dense rank 1" in fused[0].why
    folder = tmp_path / "d"
    folder.mkdir()
    (folder / "s.md").write_text("# Scratch\n\nrow reduction through the scratchpad on the npu, 12 lanes.")
    hybrid.add(folder, "npu")
    top = hybrid.retrieve(Signals("npu", text="scratchpad row reduction"), limit=2)
    assert top[0].doc.id == "user/npu/s#1" and any("dense rank" in w for w in top[0].why)
    with pytest.raises(Exception, match="unknown embedder"):
        get_embedder("nope:x")


# -- skills -------------------------------------------------------------------------------------------

TUNED = 'TUNABLES = {"BLOCK": [256, 512, 1024], "num_warps": [2, 4, 8]}\nCONFIG = {"BLOCK": 512, "num_warps": 4}\nbody = 1\n'


def _node(i: int, source: str, fitness: float, parent: int | None = None, **kw: Any) -> Node:
    shapes = kw.pop(
        "shapes", [{"name": "a", "speedup_vs_eager": fitness}, {"name": "b", "speedup_vs_eager": fitness}]
    )
    return Node(i, parent, None, kw.pop("mode", "inherit"), "evaluated", kw.pop("status", "ok"), fitness, fitness,
                None, source, verdict={"fitness": fitness, "spread": 0.01, "shapes": shapes}, **kw)  # fmt: skip


class _Spec:
    name, fingerprint = "softmax", "fp1"


def test_change_of_names_tunables_or_code_constructs() -> None:
    child = TUNED.replace('"num_warps": 4}', '"num_warps": 8}')
    assert sk.change_of(TUNED, child) == {"tunables": {"num_warps": [4, 8]}}
    code = sk.change_of("x = tl.load(p)\n", "x = tl.load(p)\ny = tl.dot(a, b)\n")
    assert code["code"]["added"] == ["tl.dot"] and code["code"]["lines"] == 1
    assert sk.describe_change({"tunables": {"BLOCK": [512, 1024]}}) == "BLOCK 512 -> 1024"


def test_skills_merge_near_duplicates_and_verify_only_when_reproduced(tmp_path: Path) -> None:
    ws = Workspace.open(tmp_path / "ws")
    parent = _node(1, TUNED, 1.0)
    child = _node(2, TUNED.replace('"num_warps": 4}', '"num_warps": 8}'), 1.3, parent=1)
    s1 = learning.skill_candidate(ws, "run1", _Spec(), "cuda", "cuda:sm90", "row", child, parent)
    assert s1["status"] == "candidate" and s1["key"] == "cuda|row|num_warps:up"
    # the same move found again elsewhere (2 -> 4 is also "num_warps up"): merged, not duplicated
    other = _node(3, TUNED.replace('"num_warps": 4}', '"num_warps": 2}'), 1.0)
    up = _node(4, TUNED, 1.2, parent=3)
    s2 = learning.skill_candidate(ws, "run2", _Spec(), "cuda", "cuda:sm90", "row", up, other)
    assert s2["id"] == s1["id"] and len(s2["provenance"]) == 2 and len(ws.skills()) == 1
    kb = KnowledgeBase(ws)
    assert not any(d.startswith("skill/") for d in kb.docs())  # a candidate is never retrieved

    tree = Tree([parent, child])

    def evaluate(good: bool) -> Any:
        def run(source: str, label: str) -> dict[str, Any]:
            fast = 'num_warps": 8' in source and good
            f = 1.3 if fast else 1.0
            return {"fitness": f, "spread": 0.01, "shapes": [{"name": "a", "speedup_vs_eager": f},
                                                            {"name": "b", "speedup_vs_eager": f}]}  # fmt: skip

        def verify() -> list[dict[str, Any]]:  # as the finish step does: measure each check's pair, record
            checks = learning.skill_checks(ws, "run1", tree, 2)
            pairs = [(run(c.parent_source, "parent"), run(c.child_source, "child")) for c in checks]
            return learning.record_skill_checks(ws, "run1", checks, pairs, 0.02, kb.index_docs)

        return verify

    assert evaluate(False)() == []
    entry = ws.skill(s1["id"])["provenance"][0]  # type: ignore[index]
    assert entry["reproduced"] is False and ws.skill(s1["id"])["status"] == "candidate"  # type: ignore[index]
    entry_reset = ws.skill(s1["id"])
    assert entry_reset is not None
    entry_reset["provenance"][0]["reproduced"] = None
    ws.put_skill(entry_reset)
    verified = evaluate(True)()
    assert [s["id"] for s in verified] == [s1["id"]]
    assert ws.skill(s1["id"])["status"] == "verified"  # type: ignore[index]
    doc = kb.get(f"skill/{s1['id']}")
    assert doc is not None and doc.meta["change"] == {"tunables": {"num_warps": [4, 8]}}
    top = kb.retrieve(
        Signals("cuda", "cuda:sm90", "row", "memory-bound", phase="late", text="num_warps"), limit=5
    )
    assert f"skill/{s1['id']}" in [h.doc.id for h in top]


def test_status_needs_another_shape_or_another_spec() -> None:
    base = {"provenance": [{"fingerprint": "a", "reproduced": True, "other_shape": False}]}
    assert sk.status_of(base) == "candidate"
    assert (
        sk.status_of({"provenance": [*base["provenance"], {"fingerprint": "b", "reproduced": True}]})
        == "verified"
    )
    assert (
        sk.status_of({"provenance": [{"fingerprint": "a", "reproduced": True, "other_shape": True}]})
        == "verified"
    )
    one_shape = sk.reproduce({"shape_gains": {"a": 1.3}}, {"fitness": 1.0, "shapes": [{"name": "a", "speedup_vs_eager": 1.0}]},
                             {"fitness": 1.3, "shapes": [{"name": "a", "speedup_vs_eager": 1.3}]}, 0.02)  # fmt: skip
    assert one_shape["reproduced"] and not one_shape["other_shape"]


# -- context memory and warm starts ---------------------------------------------------------------------


def test_analysis_and_lessons_record_what_failed_and_why() -> None:
    parent = _node(1, TUNED, 1.2)
    slower = _node(2, TUNED.replace('"BLOCK": 512', '"BLOCK": 1024'), 0.9, parent=1)
    broken = _node(
        3, TUNED, 0.0, parent=1, status="compile_error", message="out of resources: shared memory\nmore"
    )
    for n, p in ((slower, parent), (broken, parent)):
        n.analysis = learning.analyze(n, p)
    assert "BLOCK 512 -> 1024" in slower.analysis and "slower: do not repeat" in slower.analysis
    assert "failed (compile_error): out of resources: shared memory" in broken.analysis
    lessons = learning.lessons(Tree([parent, slower, broken]))
    assert [x.split(":")[0] for x in lessons] == ["node 3", "node 2"]


def test_slower_than_its_parent_means_beyond_both_measurements_noise() -> None:
    """Issue I: a node was labelled "0.74x its parent (slower: do not repeat)" from two noisy
    measurements (one verdict's spread was 62%). Slower now means beyond both spreads; within them the
    analysis says the drop is within the noise, and the lessons leave the node out."""

    def noisy(n: Node, spread: float) -> Node:
        assert n.verdict is not None
        n.verdict["spread"] = spread
        return n

    parent = noisy(_node(1, TUNED, 1.0), 0.30)
    child = noisy(_node(2, TUNED.replace('"BLOCK": 512', '"BLOCK": 1024'), 0.74, parent=1), 0.32)
    assert parent.spread == 0.30 and not learning.slower_than_parent(child, parent)
    child.analysis = learning.analyze(child, parent)
    assert "0.74x its parent" in child.analysis and "do not repeat" not in child.analysis
    assert "within the two measurements' noise, 62%" in child.analysis
    assert learning.lessons(Tree([parent, child])) == []
    steady = noisy(_node(3, TUNED, 0.74, parent=1), 0.01)
    steady_parent = noisy(_node(1, TUNED, 1.0), 0.01)
    assert learning.slower_than_parent(steady, steady_parent)


def test_warm_seeds_prefer_the_same_spec_then_the_same_computation(tmp_path: Path) -> None:
    from kernelevolve.knowledge.share import export_bundle, import_bundle

    ws = Workspace.open(tmp_path / "ws")
    spec = load_spec(SAMPLE_SPECS / "softmax.py")
    ws.record_spec(spec.fingerprint, spec.name, str(spec.path), spec.source, spec.summary())
    other = load_spec(SAMPLE_SPECS / "rmsnorm.py")
    ws.record_spec(other.fingerprint, other.name, str(other.path), other.source, other.summary())
    ops = ["_softmax"]

    def finished_run(fp: str, run_ops: list[str], source: str, fitness: float) -> str:
        run = ws.create_run(fp, "x.py", "cuda", "tuner", "uct", {"ops": run_ops}, {}, pattern="row")
        node = ws.create_node(run, None, None, "draft")
        ws.propose_node(run, node, source=source)
        verdict = {"status": "ok", "fitness": fitness, "speedup_vs_eager": fitness, "shapes": []}
        ws.finish_node(run, node, {**verdict, "spec_fingerprint": fp, "platform": "cuda", "device": "d", "method": {}},
                       1.0)  # fmt: skip
        ws.update_run(
            run, status="done", summary={"best_node": node, "final_status": "ok", "best_fitness": fitness}
        )
        return run

    finished_run(other.fingerprint, ops, "# a softmax kernel of another spec\n", 2.0)
    # better kernels that are no seed: the same pattern ("row") but another computation, a forward
    # that takes other inputs, a constructor that takes other arguments (each a wasted candidate)
    finished_run(other.fingerprint, ["mean", "rsqrt", "mul"], "# an rmsnorm kernel\n", 5.0)
    two_inputs = "class ModelNew:\n    def forward(self, x, residual):\n        return x\n"
    finished_run(other.fingerprint, ops, two_inputs, 3.0)
    with_dim = "class ModelNew:\n    def __init__(self, dim):\n        pass\n    def forward(self, x):\n        return x\n"
    finished_run(other.fingerprint, ops, with_dim, 4.0)
    seeds = learning.warm_seeds(ws, spec, "cuda", ops, exclude_run="new")
    assert [s.reason for s in seeds] == ["same computation"] and "fitness 2.00" in seeds[0].note
    assert learning.warm_seeds(ws, spec, "cuda", None, exclude_run="new") == []  # ops unknown: nothing else
    finished_run(spec.fingerprint, ops, "# softmax kernel A\n", 1.5)
    finished_run(spec.fingerprint, ops, "# softmax kernel B\n", 1.8)
    seeds = learning.warm_seeds(ws, spec, "cuda", ops, exclude_run="new")
    assert [s.source for s in seeds] == ["# softmax kernel B\n", "# softmax kernel A\n"]
    assert learning.warm_seeds(ws, spec, "cpu", ops, exclude_run="new") == []  # other platform

    bundle = tmp_path / "share.json"
    assert export_bundle(ws, bundle)["kernels"] == 6
    ws2 = Workspace.open(tmp_path / "ws2")
    assert import_bundle(ws2, bundle)["kernels"] == 6
    assert [s.reason for s in learning.warm_seeds(ws2, spec, "cuda", ops, "new")] == [
        "same spec",
        "same spec",
    ]
    bundle.write_text(bundle.read_text().replace("softmax kernel B", "softmax kernel C"))
    with pytest.raises(Exception, match="does not match its hash"):
        import_bundle(Workspace.open(tmp_path / "ws3"), bundle)


def test_a_training_spec_is_not_the_same_computation_as_its_forward(tmp_path: Path) -> None:
    """The suites' rmsnorm_backward has rmsnorm's forward (the same aten ops) but its kernels compute
    the gradients too: its reference ops end in "backward", so no warm start takes a forward-only
    kernel for it (one did, and every gradient was wrong), while a forward spec still matches."""
    from kernelevolve.optimize import reference_ops

    suites = Path(__file__).resolve().parents[1] / "suites" / "recsys"
    forward, training = load_spec(suites / "rmsnorm.py"), load_spec(suites / "rmsnorm_backward.py")
    f_ops, t_ops = reference_ops(forward), reference_ops(training)
    assert f_ops and t_ops == [*f_ops, "backward"], (f_ops, t_ops)
    ws = Workspace.open(tmp_path / "ws")
    for spec in (forward, training):
        ws.record_spec(spec.fingerprint, spec.name, str(spec.path), spec.source, spec.summary())
    run = ws.create_run(
        forward.fingerprint, "x.py", "cuda", "tuner", "uct", {"ops": f_ops}, {}, pattern="row"
    )
    node = ws.create_node(run, None, None, "draft")
    ws.propose_node(
        run,
        node,
        source="class ModelNew:\n    def __init__(self, cols=1024, eps=1e-6):\n        pass\n    def forward(self, x):\n        return x\n",
    )
    verdict = {"status": "ok", "fitness": 2.0, "speedup_vs_eager": 2.0, "shapes": []}
    ws.finish_node(
        run,
        node,
        {**verdict, "spec_fingerprint": forward.fingerprint, "platform": "cuda", "device": "d", "method": {}},
        1.0,
    )
    assert learning.warm_seeds(ws, training, "cuda", t_ops, exclude_run="new") == []
    # the control: matched on the forward's ops alone, the training spec would take that kernel
    untagged = learning.warm_seeds(ws, training, "cuda", f_ops, exclude_run="new")
    assert [s.reason for s in untagged] == ["same computation"], untagged


def test_forward_arity_reads_the_candidates_forward() -> None:
    def src(params: str) -> str:
        return (
            f"import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self{params}):\n        pass\n"
        )

    assert learning.forward_arity(src(", x")) == (1, 1)
    assert learning.forward_arity(src(", x, w, bias=None")) == (2, 3)
    assert learning.forward_arity(src(", x, *rest")) == (1, None)
    assert learning.forward_arity("def forward(self, x): pass") is None  # no ModelNew
    assert learning.forward_arity("class ModelNew(:") is None  # does not parse


# -- patterns and diagnosis ------------------------------------------------------------------------------


def test_operator_patterns_of_the_sample_specs() -> None:
    found = {p.stem: spec_pattern(load_spec(p)) for p in sorted(SAMPLE_SPECS.glob("*.py"))}
    assert found == {
        "attention": "attention", "attention_causal": "attention", "bias_gelu": "elementwise",
        "bmm": "batched-gemm", "bucketize": "bucketize", "bucketized_dense_features": "row",
        "conv1d_serving": "conv", "conv2d": "conv", "embedding_bag": "gather", "embedding_bag_mean": "gather",
        "event_truncation": "gather", "feature_hashing": "elementwise", "feature_id_mapping": "gather",
        "ffn_block": "gemm", "fm_interaction": "batched-gemm", "inverted_index_scoring": "gather",
        "jagged_sum": "gather",  # get_inputs needs values: its ops are recorded on the CPU
        "linear_cross_entropy": "gemm", "linear_relu": "gemm", "rmsnorm": "row", "rmsnorm_backward": "row",
        "rotary": "elementwise", "sdpa_mlp_block": "attention", "softmax": "row", "topk_sampling": "row",
    }  # fmt: skip
    assert classify([]) == "" and classify(["add", "mul"]) == "elementwise" and classify(["cumsum"]) == "scan"


def _verdict(frac: float, bound: str, t_us: float = 100.0) -> dict[str, Any]:
    return {"shapes": [{"name": "big", "weight": 1.0, "candidate": {"median_s": t_us * 1e-6},
                        "roofline_fraction": frac, "bound": bound}]}  # fmt: skip


def test_diagnosis_classes_on_synthetic_profiles() -> None:
    assert diagnose({"shapes": []}) is None
    mem = diagnose(_verdict(0.41, "memory"))
    assert mem is not None and mem["class"] == "memory-bound" and not mem["at_roofline"]
    assert "41% of measured bandwidth" in mem["directives"][0]
    comp = diagnose(_verdict(0.9, "compute"))
    assert comp is not None and comp["class"] == "compute-bound" and comp["at_roofline"]
    assert diagnose(_verdict(0.2, "launch", 4.0))["class"] == "launch-bound"  # type: ignore[index]
    # torch.profiler: three kernels per call and host overhead above the kernels' time
    prof = {
        "profiler": {"kernels_per_call": 3.0, "device_us_per_call": 6.0, "launch_overhead_us_per_call": 20.0}
    }
    d = diagnose(_verdict(0.3, "memory", 26.0), prof)
    assert d is not None and d["class"] == "launch-bound"
    assert any("3 kernels per call where 1 would do" in x for x in d["directives"])
    # the same overhead on a shape timed as CUDA graphs is not charged: no reclassification
    graphed = _verdict(0.3, "memory", 26.0)
    graphed["shapes"][0]["cuda_graphs"] = True
    d = diagnose(graphed, {**prof, "shape": "big"})
    assert (
        d is not None and d["class"] == "memory-bound" and not any("host-side" in x for x in d["directives"])
    )
    # ncu: low achieved occupancy with many registers
    occ = {"ncu": {"summary": {"achieved_occupancy_pct": 18.0, "theoretical_occupancy_pct": 25.0,
                               "max_registers_per_thread": 168, "dram_throughput_pct": 30.0, "top_stalls": []}}}  # fmt: skip
    d = diagnose(_verdict(0.3, "memory"), {**occ, "device_s": {"ncu": 0.4}})
    assert d is not None and d["class"] == "occupancy-limited"
    assert d["metrics"]["device_s"] == {"ncu": 0.4}  # what the profile held the lease for, kept
    assert (
        any("168 registers" in x for x in d["directives"])
        and d["metrics"]["ncu"]["max_registers_per_thread"] == 168
    )
    # ncu: DRAM far from peak while warps wait on memory: latency-bound
    lat = {"ncu": {"summary": {"achieved_occupancy_pct": 80.0, "dram_throughput_pct": 35.0, "max_spill_bytes": 512,
                               "top_stalls": [{"reason": "long_scoreboard", "ratio": 20.0}]}}}  # fmt: skip
    d = diagnose(_verdict(0.35, "memory"), lat)
    assert d is not None and d["class"] == "latency-bound"
    assert any("spill" in x for x in d["directives"])
