"""The universal operator (`synth/operator.py`) and its prompt (`synth/prompt.py`), driven by a scripted
chat model registered through the real provider registry. No harness runs: the tools are fakes."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from kernelevolve.spec import Spec, load_spec
from kernelevolve.synth import providers
from kernelevolve.synth.base import NodeView, Snippet, Task
from kernelevolve.synth.operator import LLMOperator, extract_code
from kernelevolve.synth.prompt import estimate_tokens, rules, synthesize
from kernelevolve.synth.providers.base import ProviderError, Usage
from kernelevolve.synth.providers.meter import Meter, WorkspaceCap
from kernelevolve.synth.providers.pricing import Price
from tests.fakes import FakeTools, ScriptedModel, call, kb_search, register_scripted, text_reply, tool_reply

EXAMPLES = Path(__file__).parent.parent / "examples" / "softmax"
PARENT_SOURCE = (EXAMPLES / "triton_rowsoftmax.py").read_text()
OLD_WARPS = "warps = 4 if block <= 2048 else 8 if block <= 8192 else 16"
NEW_WARPS = "warps = 8 if block <= 4096 else 16"
PRICES = {"scripted:fake-1": Price(input=2.0, output=10.0)}


@pytest.fixture(scope="module")
def spec() -> Spec:
    return load_spec(EXAMPLES / "spec.py")


@pytest.fixture(autouse=True)
def scripted_provider() -> Iterator[None]:
    register_scripted()
    yield
    providers.unregister("scripted")


def scripted(*script: object, tools: bool = True, context_tokens: int = 200_000) -> ScriptedModel:
    model = providers.get_model(
        "scripted:fake-1", script=list(script), tools=tools, context_tokens=context_tokens
    )
    assert isinstance(model, ScriptedModel)
    return model


def node(
    id: int, parent: int | None, *, status: str | None = "ok", fitness: float = 1.0, **kw: object
) -> NodeView:
    return NodeView(id=id, parent=parent, mode=str(kw.pop("mode", "inherit")), source=str(kw.pop("source", PARENT_SOURCE)),
                    status=status, fitness=fitness, **kw)  # type: ignore[arg-type]  # fmt: skip


def make_task(spec: Spec, mode: str = "inherit", parents: list[NodeView] | None = None, **kw: object) -> Task:
    if parents is None:
        parents = [
            node(5, 2, fitness=1.2, speedup_vs_eager=2.0, speedup_vs_compile=1.2, note="one row per program")
        ]
    return Task(run_id="r1", node_id=9, spec=spec, platform="cuda", platform_target="cuda:sm90",
                kinds=("triton", "cuda"), mode=mode, parents=parents, **kw)  # type: ignore[arg-type]  # fmt: skip


# --- tool mode -------------------------------------------------------------------------------------


def test_tool_loop_reads_edits_checks_and_submits(spec: Spec) -> None:
    model = scripted(
        tool_reply(call("read_file", path="candidate.py"), text="Reading the parent first."),
        tool_reply(call("replace", old=OLD_WARPS, new=NEW_WARPS)),
        tool_reply(call("lint"), call("quick_run")),
        tool_reply(call("search_knowledge", query="softmax row reduction warps", limit=2)),
        tool_reply(call("submit", note="8 warps from 2048 columns up")),
    )
    meter = Meter(prices=PRICES)
    tools = FakeTools()
    proposal = LLMOperator(model, meter).propose(make_task(spec), tools)

    assert proposal.error is None
    assert proposal.source == PARENT_SOURCE.replace(OLD_WARPS, NEW_WARPS)
    assert proposal.note == "8 warps from 2048 columns up"
    assert [a["tool"] for a in proposal.actions] == [
        "read_file",
        "replace",
        "lint",
        "quick_run",
        "search_knowledge",
        "submit",
    ]
    assert all(a["ok"] for a in proposal.actions)
    assert [a["step"] for a in proposal.actions] == [1, 2, 3, 3, 4, 5]
    # lint and quick_run saw the edited file; the model saw the file it asked for and the tools' answers
    assert [name for name, _ in tools.calls] == ["lint", "quick_run", "search_knowledge"]
    assert NEW_WARPS in tools.calls[0][1]
    second = model.sent[1]
    assert second[-1].role == "tool" and second[-1].content == PARENT_SOURCE
    fourth = model.sent[3]
    assert "1.31x vs eager" in fourth[-1].content and fourth[-2].content == "ok"
    expected = kb_search("softmax row reduction warps", limit=2)  # what the knowledge base answers
    assert expected and f"### {expected[0].title}" in model.sent[4][-1].content  # clipped to RESULT_CHARS
    # the tools offered, the prompt recorded, the accounting summed
    assert [t.name for t in model.tools_sent[0] or []] == [
        "read_file", "write_file", "replace", "lint", "quick_run", "search_knowledge", "submit"
    ]  # fmt: skip
    assert proposal.prompt is not None and "ModelNew" in proposal.prompt
    assert proposal.response == "Reading the parent first."
    assert (proposal.tokens_in, proposal.tokens_out) == (5000, 500)
    assert proposal.cost_usd == pytest.approx((5000 * 2.0 + 500 * 10.0) / 1e6)
    assert meter.usd == pytest.approx(proposal.cost_usd) and meter.calls == 5


def test_tool_errors_are_fed_back_and_the_loop_goes_on(spec: Spec) -> None:
    model = scripted(
        tool_reply(call("replace", old="no such text", new="x")),
        tool_reply(call("replace", old="tl.", new="tl .")),  # ambiguous
        tool_reply(call("read_file", path="/etc/passwd")),
        tool_reply(call("replace", old=OLD_WARPS)),  # missing argument
        tool_reply(call("quick_run")),
        tool_reply(call("replace", old=OLD_WARPS, new=NEW_WARPS), call("submit", note="more warps")),
    )
    tools = FakeTools(quick_run=lambda src: (_ for _ in ()).throw(RuntimeError("worker died")))
    proposal = LLMOperator(model, Meter(prices=PRICES)).propose(make_task(spec), tools)
    assert proposal.source is not None and NEW_WARPS in proposal.source
    results = [(a["tool"], a["ok"], a["result"]) for a in proposal.actions]
    assert results[0][1] is False and "not found" in results[0][2]
    assert results[1][1] is False and "occurs" in results[1][2]
    assert results[2][1] is False and "no file" in results[2][2] and "node_5.py" in results[2][2]
    assert results[3][1] is False and "needs `new`" in results[3][2]
    assert results[4][1] is False and "worker died" in results[4][2]
    sent = model.sent[1][-1]
    assert sent.role == "tool" and sent.is_error and sent.content.startswith("error:")


def test_submit_is_refused_until_the_file_changes(spec: Spec) -> None:
    tried = {hashlib.sha256(b"import torch\nclass ModelNew: pass\n").hexdigest()}
    model = scripted(
        tool_reply(call("submit", note="nothing")),
        tool_reply(
            call("write_file", content="import torch\nclass ModelNew: pass\n"), call("submit", note="x")
        ),
        tool_reply(call("write_file", content=PARENT_SOURCE + "\n# v2\n"), call("submit", note="v2")),
    )
    proposal = LLMOperator(model, Meter(prices=PRICES)).propose(make_task(spec, tried=tried), FakeTools())
    assert proposal.source == PARENT_SOURCE + "\n# v2\n"
    refusals = [a["result"] for a in proposal.actions if a["tool"] == "submit" and not a["ok"]]
    assert "unchanged from the parent" in refusals[0]
    assert "already evaluated" in refusals[1]


def test_a_plain_answer_with_code_is_taken_in_tool_mode(spec: Spec) -> None:
    answer = "No tools needed.\n```python\n" + PARENT_SOURCE.replace(OLD_WARPS, NEW_WARPS) + "```\n"
    model = scripted(text_reply("Let me think."), text_reply(answer))
    proposal = LLMOperator(model, Meter(prices=PRICES)).propose(make_task(spec), FakeTools())
    assert proposal.source is not None and NEW_WARPS in proposal.source
    assert proposal.note == "No tools needed."
    assert "Use the tools" in model.sent[1][-1].content


def test_step_limit_proposes_a_changed_file_or_fails(spec: Spec) -> None:
    edit = tool_reply(call("replace", old=OLD_WARPS, new=NEW_WARPS))
    model = scripted(edit, tool_reply(call("lint")), tool_reply(call("lint")))
    proposal = LLMOperator(model, Meter(prices=PRICES), max_steps=3).propose(make_task(spec), FakeTools())
    assert proposal.source is not None and NEW_WARPS in proposal.source
    assert "step limit (3)" in proposal.note
    assert len(model.sent) == 3

    model = scripted(*[tool_reply(call("lint")) for _ in range(3)])
    proposal = LLMOperator(model, Meter(prices=PRICES), max_steps=3).propose(make_task(spec), FakeTools())
    assert proposal.source is None and proposal.error is not None
    assert "step limit (3)" in proposal.error and "unchanged" in proposal.error
    assert not proposal.exhausted


def test_draft_starts_from_an_empty_file(spec: Spec) -> None:
    model = scripted(
        tool_reply(call("read_file", path="candidate.py"), call("read_file", path="reference.py")),
        tool_reply(call("submit", note="early")),
        tool_reply(call("write_file", content=PARENT_SOURCE), call("submit", note="first kernel")),
    )
    task = make_task(spec, mode="draft", parents=[])
    proposal = LLMOperator(model, Meter(prices=PRICES)).propose(task, FakeTools())
    assert proposal.source == PARENT_SOURCE and proposal.note == "first kernel"
    assert "is empty" in model.sent[1][-2].content
    assert "class Model(nn.Module)" in model.sent[1][-1].content
    assert "empty" in proposal.actions[2]["result"]


# --- faults become values ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fault", "expected"),
    [
        (
            ProviderError(
                "malformed", "scripted:fake-1 called 'write_file' with arguments that are not JSON"
            ),
            "malformed",
        ),
        (ProviderError("timeout", "scripted:fake-1: no answer within 300 s"), "timeout"),
        (ProviderError("rate_limit", "HTTP 429 after 4 retries"), "rate_limit"),
    ],
)
def test_provider_faults_become_failed_proposals(spec: Spec, fault: ProviderError, expected: str) -> None:
    model = scripted(tool_reply(call("lint")), fault)
    proposal = LLMOperator(model, Meter(prices=PRICES)).propose(make_task(spec), FakeTools())
    assert proposal.source is None and proposal.error is not None
    assert proposal.error.startswith("scripted:fake-1: " + expected)
    assert not proposal.exhausted
    assert proposal.tokens_in == 1000 and len(proposal.actions) == 1  # what the first step cost is kept


def test_unknown_tool_fails_the_expansion(spec: Spec) -> None:
    model = scripted(tool_reply(call("run_shell", cmd="nvidia-smi")))
    proposal = LLMOperator(model, Meter(prices=PRICES)).propose(make_task(spec), FakeTools())
    assert proposal.source is None and proposal.error is not None
    assert "unknown tool 'run_shell'" in proposal.error and "submit" in proposal.error


def test_an_unexpected_bug_does_not_escape_propose(spec: Spec) -> None:
    model = scripted(lambda messages: 1 / 0)
    proposal = LLMOperator(model, Meter(prices=PRICES)).propose(make_task(spec), FakeTools())
    assert proposal.source is None and proposal.error is not None and "ZeroDivisionError" in proposal.error


# --- single shot ------------------------------------------------------------------------------------


def test_single_shot_takes_the_last_python_block(spec: Spec) -> None:
    answer = (
        "Two ideas; the second is better: more warps for wide rows.\n"
        "```python\nfirst = 1\n```\nAnd then:\n```python\n" + PARENT_SOURCE + "```\n"
    )
    model = scripted(text_reply(answer, tokens=(3000, 800)), tools=False)
    meter = Meter(prices=PRICES)
    operator = LLMOperator(model, meter)
    assert not operator.tool_mode
    proposal = operator.propose(make_task(spec), FakeTools())
    assert proposal.source == PARENT_SOURCE
    assert proposal.note.startswith("Two ideas")
    assert model.tools_sent == [None]
    assert [a["tool"] for a in proposal.actions] == ["answer"]
    assert proposal.cost_usd == pytest.approx((3000 * 2 + 800 * 10) / 1e6)
    system = model.sent[0][0].content
    assert "last ```python block" in system and "read_file" not in system


def test_single_shot_without_code_fails_clearly(spec: Spec) -> None:
    model = scripted(text_reply("I would use more warps."), tools=False)
    proposal = LLMOperator(model, Meter(prices=PRICES)).propose(make_task(spec), FakeTools())
    assert proposal.source is None
    assert proposal.error == "scripted:fake-1 answered without a ```python block"

    cut = text_reply("Here:\n```python\nimport torch\nclass ModelNew", stop="max_tokens")
    model = scripted(cut, tools=False)
    proposal = LLMOperator(model, Meter(prices=PRICES), tool_mode=False).propose(make_task(spec), FakeTools())
    assert proposal.error is not None and "cut off at max_tokens" in proposal.error


def test_extract_code_forms() -> None:
    assert extract_code("```py\nx = 1\n```") == "x = 1\n"
    assert extract_code("```\nclass ModelNew: pass\n```") == "class ModelNew: pass\n"
    assert extract_code("```\nprint(1)\n```") is None
    assert extract_code("no code") is None


# --- accounting and caps -----------------------------------------------------------------------------


def test_usd_cap_stops_the_next_call_cleanly(spec: Spec) -> None:
    meter = Meter(max_usd=0.01, prices=PRICES)
    # step 1 costs 1000*2/1e6 + 1000*10/1e6 = $0.012: over the cap, so step 2 never happens
    model = scripted(tool_reply(call("replace", old=OLD_WARPS, new=NEW_WARPS), tokens=(1000, 1000)))
    proposal = LLMOperator(model, meter).propose(make_task(spec), FakeTools())
    assert proposal.source is None and proposal.exhausted
    assert proposal.error is not None and proposal.error.startswith("budget cap reached: spent $0.0120")
    assert len(model.sent) == 1 and proposal.cost_usd == pytest.approx(0.012)

    again = scripted()
    proposal = LLMOperator(again, meter).propose(make_task(spec), FakeTools())
    assert proposal.exhausted and again.sent == [] and proposal.tokens_in == 0


def test_workspace_cap_counts_the_other_runs_and_reads_them_live() -> None:
    spent = {"tokens": 0, "usd": 0.0}
    reads = []

    def elsewhere() -> tuple[int, float]:
        reads.append(1)
        return spent["tokens"], spent["usd"]

    cap = WorkspaceCap(max_usd=1.0, max_tokens=None, elsewhere=elsewhere, refresh_s=0.0)
    meter = Meter(max_usd=5.0, prices=PRICES, workspace_cap=cap)
    meter.charge("scripted:fake-1", Usage(tokens_in=100_000, tokens_out=0))  # $0.20 for this run
    assert meter.exceeded() is None
    spent["usd"] = 0.85  # another run of the workspace spends meanwhile
    why = meter.exceeded()
    assert why is not None and "workspace has spent $1.0500 of its $1.00 cap" in why
    assert len(reads) == 2  # read again, not remembered from the first check

    tokens = Meter(prices={}, workspace_cap=WorkspaceCap(None, 1000, lambda: (900, 0.0)))
    assert tokens.exceeded() is None
    tokens.charge("local-model", Usage(tokens_in=60, tokens_out=40))
    assert "1000 tokens of its 1000-token cap" in (tokens.exceeded() or "")


def test_token_cap_and_unpriced_models(spec: Spec) -> None:
    meter = Meter(max_tokens=1500, prices={})  # nothing priced
    model = scripted(text_reply("```python\n" + PARENT_SOURCE + "```", tokens=(1200, 400)), tools=False)
    first = LLMOperator(model, meter).propose(make_task(spec), FakeTools())
    assert first.source == PARENT_SOURCE and first.cost_usd == 0.0
    assert meter.unpriced == ["scripted:fake-1"]
    second = LLMOperator(scripted(tools=False), meter).propose(make_task(spec), FakeTools())
    assert second.exhausted and second.error == "budget cap reached: used 1600 tokens of the 1500-token cap"
    assert meter.summary()["tokens_in"] == 1200


def test_reply_tokens_fit_small_context_windows(spec: Spec) -> None:
    model = scripted(text_reply("```python\n" + PARENT_SOURCE + "```"), tools=False, context_tokens=8192)
    operator = LLMOperator(model, Meter(prices=PRICES))
    operator.propose(make_task(spec), FakeTools())
    assert model.max_tokens_sent == [2048]
    assert sum(estimate_tokens(m.content) for m in model.sent[0]) <= 8192 - 2048


def test_long_conversations_elide_old_tool_results(spec: Spec) -> None:
    big = "x = 1\n" * 6000  # ~9000 tokens per read
    reads = [tool_reply(call("read_file", path="candidate.py")) for _ in range(4)]
    model = scripted(tool_reply(call("write_file", content=big + "class ModelNew: pass\n")), *reads,
                     tool_reply(call("submit", note="ok")), context_tokens=32_000)  # fmt: skip
    operator = LLMOperator(model, Meter(prices=PRICES), reply_tokens=4096)
    proposal = operator.propose(make_task(spec), FakeTools())
    assert proposal.source is not None
    last = model.sent[-1]
    assert sum(estimate_tokens(m.content) for m in last) < 32_000
    assert any(m.content == "[elided to save context]" for m in last)
    assert last[1].role == "user" and "Problem" in last[1].content  # the prompt itself is never elided


# --- prompt synthesis -----------------------------------------------------------------------------------


def failed_parent() -> NodeView:
    message = (
        "compile_error: triton.compiler.errors.CompilationError: at 12:8:\n"
        "    offs = tl.arange(0, n_cols)\n"
        "ValueError: arange's range must be a power of 2"
    )
    return node(7, 5, status="compile_error", fitness=0.0, message=message, note="loop over columns")


def test_prompt_of_a_failed_parent_centers_its_error(spec: Spec) -> None:
    knowledge = kb_search("triton compile error arange power of 2")
    task = make_task(spec, parents=[failed_parent()], knowledge=knowledge)
    system, user = synthesize(task, max_tokens=12_000, tool_mode=True)
    assert "arange's range must be a power of 2" in user
    assert "The parent #7 failed (compile_error)" in user
    assert "class Model(nn.Module)" in user  # the reference
    assert "decode (weight 0.50): get_inputs(rows=256, cols=1024) -> inputs float32[256, 1024]" in user
    assert "strict_fp32" in user and "relative norm 5e-05" in user
    assert knowledge and knowledge[0].title in user and "## Retrieved knowledge" in user
    for rule in rules(task):
        assert rule in system
    for word in ("try/except", "side streams", "caching", "TF32", "patch", "threads", "network", "`Model`"):
        assert word in system
    assert "TUNABLES" in system and "ModelNew" in system


def test_prompt_names_platform_kinds_and_untimed_ones(spec: Spec) -> None:
    task = Task(run_id="r", node_id=1, spec=spec, platform="cpu", platform_target="cpu:x86_64-avx2",
                kinds=("c", "triton"), mode="draft", hardware={"device": "EPYC", "bandwidth": 2e11,
                "flops": {"fp32": 3e12}})  # fmt: skip
    _, user = synthesize(task, max_tokens=20_000, tool_mode=False)
    assert "compile_c" in user and "-fopenmp" in user
    assert "triton is checked for correctness only" in user
    assert "measured bandwidth 0.20 TB/s" in user
    assert "There is no parent" in user


def test_prompt_respects_the_budget_in_priority_order(spec: Spec) -> None:
    knowledge = [
        Snippet(doc=f"kb:{i}", title=f"note {i}", text="advice " * 300, score=float(i)) for i in range(12)
    ]
    history = [node(i, 2, fitness=1.0 + i / 10, note=f"idea {i}", status="ok") for i in range(10, 40)]
    task = make_task(spec, mode="compare", parents=[failed_parent()], knowledge=knowledge, history=history)

    def size(t: Task, budget: int = 1_000_000) -> tuple[int, str, str]:
        system, user = synthesize(t, max_tokens=budget, tool_mode=True)
        return estimate_tokens(system) + estimate_tokens(user), system, user

    full, full_system, full_user = size(task)
    assert "kb:0" in full_user and "idea 10" in full_user and "idea 39" in full_user
    no_knowledge, _, _ = size(replace(task, knowledge=[]))
    bare, _, _ = size(replace(task, knowledge=[], history=[]))
    assert bare < no_knowledge < full

    # 1. knowledge gives way first, and all of it before any history
    total, system, user = size(task, no_knowledge)
    assert total <= no_knowledge and system == full_system
    assert "kb:" not in user and "idea 10" in user and "idea 39" in user
    # ... shortened, then dropped weakest first
    total, _, user = size(task, no_knowledge + 250)
    assert total <= no_knowledge + 250
    assert "kb:11" in user and "kb:0" not in user and "advice advice ..." in user
    # 2. then history; 3. then sources are elided; the parent's error text stays
    total, _, user = size(task, bare - 150)
    assert total <= bare - 150
    assert "idea" not in user and "elided to fit the prompt" in user
    assert "arange's range must be a power of 2" in user
    # 5. an impossible budget still holds, except for the system message, which never gives way
    total, system, user = size(task, 900)
    assert estimate_tokens(user) <= max(0, 900 - estimate_tokens(system)) + 1
    assert user.endswith("[... prompt cut to fit the model's context ...]")


def test_history_gives_way_most_distant_first(spec: Spec) -> None:
    # lineage 1 -> 2 -> 3 -> parent 4; siblings of the parent: 6, 8
    lineage = [
        node(1, None, mode="draft", note="first kernel"),
        node(2, 1, note="masking"),
        node(3, 2, note="warps"),
    ]
    siblings = [node(6, 3, note="sibling six"), node(8, 3, note="sibling eight")]
    parent = node(4, 3, fitness=1.5, note="parent")
    task = make_task(spec, mode="combine", parents=[parent], history=[*lineage, *siblings])
    system, full = synthesize(task, max_tokens=100_000, tool_mode=True)
    assert all(f"- #{i} " in full for i in (1, 2, 3, 6, 8))
    budget = estimate_tokens(system) + estimate_tokens(full)
    order = []
    for _ in range(5):
        budget -= 1
        while True:
            _, user = synthesize(task, max_tokens=budget, tool_mode=True)
            gone = [i for i in (1, 2, 3, 6, 8) if f"- #{i} " not in user and i not in order]
            if gone:
                order += gone
                break
            budget -= 10
    assert order[:2] == [1, 2]  # the root first, then up the lineage; the parent's neighbors last
    assert set(order[2:]) == {3, 6, 8}


def test_memory_modes_change_the_history_shown(spec: Spec) -> None:
    ancestors = [node(1, None, mode="draft", note="first kernel", fitness=1.0),
                 node(2, 1, note="masked tail", fitness=1.1)]  # fmt: skip
    siblings = [
        node(
            6,
            2,
            note="BLOCK 4096",
            fitness=1.6,
            config={"BLOCK": 4096, "num_warps": 8},
            diagnosis={"bound": "memory"},
        ),
        node(
            7,
            2,
            note="BLOCK 512",
            fitness=0.8,
            config={"BLOCK": 512, "num_warps": 4},
            diagnosis={"bound": "latency"},
        ),
        node(8, 2, status="incorrect", fitness=0.0, message="max_abs_err 0.3 at shape wide"),
    ]
    parent = node(3, 2, fitness=1.2, note="parent")

    def user_for(mode: str) -> str:
        task = make_task(spec, mode=mode, parents=[parent], history=[*ancestors, *siblings])
        return synthesize(task, max_tokens=50_000, tool_mode=True)[1]

    inherit, compare, combine, fresh = (user_for(m) for m in ("inherit", "compare", "combine", "fresh"))
    assert "Lineage of the parent" in inherit and "first kernel" in inherit
    assert "#2 [inherit] ok, fitness 1.10 (1.10x its parent #1)" in inherit
    assert "Lineage" in combine and "siblings" in combine
    assert "Lineage" not in compare or "first kernel" in compare  # the engine chose the nodes; shown as given
    assert "What separated them" in compare
    assert "Fastest #6 (1.60) against slowest #7 (0.80)" in compare
    assert "BLOCK 512 -> 4096" in compare and "num_warps 4 -> 8" in compare
    assert "incorrect x1" in compare
    assert "memory-bound, the slowest latency-bound" in compare
    for word in ("Lineage", "siblings", "first kernel", "BLOCK 4096"):
        assert word not in fresh
    assert "#6 " not in fresh


def test_crossover_starts_from_the_fitter_parent(spec: Spec) -> None:
    a = node(3, 1, fitness=1.1, source=PARENT_SOURCE + "# a\n")
    b = node(4, 1, fitness=1.4, source=PARENT_SOURCE + "# b\n")
    model = scripted(
        tool_reply(call("read_file", path="candidate.py")), tool_reply(call("read_file", path="node_3.py"))
    )
    proposal = LLMOperator(model, Meter(prices=PRICES), max_steps=2).propose(
        make_task(spec, mode="combine", parents=[a, b]), FakeTools()
    )
    assert model.sent[1][-1].content.endswith("# b\n")
    assert model.sent[2 - 1][-1].content == b.source
    assert "Combine the parents #3 and #4" in model.sent[0][1].content
    assert proposal.error is not None and "step limit" in proposal.error


# --- registry and knowledge --------------------------------------------------------------------------------


def test_registry_lists_builtins_and_refuses_unknown_names() -> None:
    names = providers.all_providers()
    assert {"openai", "anthropic", "scripted"} <= set(names)
    with pytest.raises(ProviderError) as info:
        providers.get_model("nosuch:model")
    assert "unknown provider 'nosuch'" in str(info.value) and "anthropic, openai, scripted" in str(info.value)
    with pytest.raises(ProviderError) as info:
        providers.get_model("gpt-4o")
    assert "provider:model" in str(info.value)
    with pytest.raises(ProviderError) as info:
        providers.get_model("scripted:x", temperature=0.2)
    assert info.value.kind == "config" and "temperature" in str(info.value)
    model = providers.get_model("scripted:llama3.1:8b", workspace="/tmp/ws")
    assert model.name == "scripted:llama3.1:8b"
