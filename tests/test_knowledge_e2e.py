"""The knowledge features end to end on the CPU, through the CLI and the agent interface: kb search,
add, list and show; profile SPEC CANDIDATE --json; the agent's prompt carrying retrieved documents and
the diagnosis; a warm start from an earlier run of the same spec; sharing between workspaces."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from kernelevolve.cli_common import EXIT_NOT_FASTER, EXIT_OK
from kernelevolve.search.limits import Limits
from kernelevolve.search.policies import SearchConfig
from kernelevolve.store import Workspace
from kernelevolve.synth import SynthConfig

from .conftest import EXAMPLES, SPECS, cpu_settings
from .test_search_e2e import C_SOFTMAX, cli


def test_kb_cli_search_add_list_show(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    found = cli("kb", "search", "memory bound row reduction hopper", "--json", ws=ws)
    assert found.returncode == 0, found.stderr
    # reading the shipped documents creates no workspace; `kb add` (the control) does
    assert not ws.exists()
    assert cli("kb", "show", "constraints/valid-candidate", ws=ws).returncode == 0 and not ws.exists()
    assert "constraints/valid-candidate" in [
        d["id"] for d in json.loads(cli("kb", "list", "--json", ws=ws).stdout)
    ]
    assert not ws.exists()
    results = json.loads(found.stdout)["results"]
    assert results and results[0]["score"] > 0 and {"id", "title", "category", "text"} <= set(results[0])
    manuals = tmp_path / "manuals"
    manuals.mkdir()
    (manuals / "npu.md").write_text("# Vela NPU\n\nThe Vela vector unit is 128 lanes wide; tiles of 4 KiB.\n")
    added = cli("kb", "add", str(manuals), "--platform", "npu:v2", "--json", ws=ws)
    assert added.returncode == 0 and json.loads(added.stdout)["ids"] == ["user/npu/npu#1"]
    npu = json.loads(cli("kb", "search", "vector lanes", "--platform", "npu", "--json", ws=ws).stdout)
    assert npu["results"][0]["id"] == "user/npu/npu#1"
    listed = json.loads(cli("kb", "list", "--platform", "npu", "--json", ws=ws).stdout)
    assert "user/npu/npu#1" in [d["id"] for d in listed]
    shown = cli("kb", "show", "constraints/valid-candidate", ws=ws)
    assert shown.returncode == 0 and "ModelNew" in shown.stdout
    missing = cli("kb", "show", "no/such/doc", ws=ws)
    assert missing.returncode != 0 and "kb list" in missing.stderr
    assert cli("kb", "add", str(tmp_path / "nope"), "--platform", "x", ws=ws).returncode != 0
    # skills: what `skills list` and `skills show` print of a stored skill
    provenance = [{"run": "r1", "spec": "softmax", "fingerprint": "f", "parent": 1, "child": 2, "gain": 1.25,
                   "reproduced": True, "reproduced_gain": 1.2}]  # fmt: skip
    with Workspace.open(ws) as w:
        w.put_skill({"id": "abc123", "key": "k", "title": "row on cuda:sm90: num_warps 4 -> 8", "platform": "cuda",
                     "target": "cuda:sm90", "pattern": "row", "change": {"tunables": {"num_warps": [4, 8]}},
                     "text": "num_warps 4 -> 8 made it faster", "status": "verified", "provenance": provenance})  # fmt: skip
    listed_skills = json.loads(cli("skills", "list", "--status", "verified", "--json", ws=ws).stdout)
    assert [s["id"] for s in listed_skills] == ["abc123"]
    shown_skill = cli("skills", "show", "abc", ws=ws)
    assert (
        shown_skill.returncode == 0
        and "reproduced 1.20x" in shown_skill.stdout
        and "nodes 1->2" in shown_skill.stdout
    )
    assert cli("skills", "show", "zzz", ws=ws).returncode == 2


def test_profile_cli_prints_diagnosis_roofline_and_metrics(tmp_path: Path) -> None:
    done = cli("profile", str(SPECS / "softmax.py"), str(EXAMPLES / "softmax/c_rowsoftmax.py"),
               "--platform", "cpu", "--json", ws=tmp_path / "ws")  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["status"] == "ok" and result["diagnosis"]["class"] in (
        "memory-bound",
        "compute-bound",
        "launch-bound",
    )
    assert isinstance(result["roofline_fraction"], float) and 0 < result["roofline_fraction"] < 1.5
    assert result["metrics"]["tools"] == ["torch.profiler"] and result["metrics"]["profiler"]["iters"] >= 1
    assert not any("ncu" in e for e in result["metrics"]["errors"])  # ncu is not tried on the CPU
    bad = cli(
        "profile",
        str(SPECS / "softmax.py"),
        str(tmp_path / "missing.py"),
        "--platform",
        "cpu",
        ws=tmp_path / "ws",
    )
    assert bad.returncode == 2 and "no such candidate" in bad.stderr


def test_agent_prompt_carries_retrieved_documents_and_the_diagnosis(tmp_path: Path) -> None:
    from kernelevolve import agent_jobs as agent
    from kernelevolve.optimize import start

    ws = tmp_path / "ws"
    settings = replace(cpu_settings(tmp_path), workspace=ws)
    run_id = start(
        SPECS / "softmax.py", settings, SearchConfig(draft=1), Limits(budget=3), SynthConfig("agent")
    )
    first = Path(agent.next_task(ws, run_id)["files"]["task"]).read_text()
    assert "## Retrieved knowledge" in first and "constraints/" in first  # the draft phase: the rules
    assert agent.submit(ws, run_id, 1, C_SOFTMAX)["status"] == "ok"
    shown = cli("agent", "next", run_id, ws=ws)  # what the done-when names: the CLI prints the prompt
    assert shown.returncode == 0, shown.stderr[-2000:]
    prompt = shown.stdout
    assert "## Retrieved knowledge" in prompt and "diagnosis: " in prompt and "% of the roofline" in prompt
    assert "## The reference's own numbers" in prompt and "eager " in prompt
    with Workspace.open(ws) as w:
        node = w.nodes(run_id)[0]
    assert node["analysis"].startswith("tried:") or "measured: fitness" in node["analysis"]


def test_warm_start_seeds_a_new_run_from_an_earlier_one_and_shares(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    args = (
        "optimize",
        str(SPECS / "ew_flat.py"),
        "--platform",
        "cpu",
        "--budget",
        "2",
        "--draft",
        "2",
        "--json",
    )
    # Either run may end "not faster" (exit 4) where the final re-measure in a fresh worker loses the
    # kernel's lead to the load of a 2-core machine: both mean a correct kernel, which is what seeds.
    correct = (EXIT_OK, EXIT_NOT_FASTER)
    first = cli(*args, ws=ws)
    assert first.returncode in correct, first.stderr[-3000:]
    cold = json.loads(first.stdout)
    assert cold["warm_start"] == [] and cold["best_node"] is not None
    second = cli(*args, ws=ws)
    assert second.returncode in correct, second.stderr[-3000:]
    warm = json.loads(second.stdout)
    assert warm["warm_start"] and "warm start (same spec)" in warm["warm_start"][0]["note"]
    assert f"run {cold['run_id']}" in warm["warm_start"][0]["note"] and "warm start" in second.stderr
    with Workspace.open(ws) as w:
        nodes = w.nodes(warm["run_id"])
        seeded = {n["candidate_hash"]: n for n in w.nodes(cold["run_id"])}
    assert nodes[0]["mode"] == "warm" and nodes[0]["state"] == "evaluated" and nodes[0]["verdict"]
    # The seed is a kernel the first run evaluated, on this device with these settings: its verdict is
    # reused where it was correct (or incorrect), not measured again, and the node says so; a verdict
    # that may have been the machine's moment (a timeout, a flag) is measured again.
    earlier = seeded[nodes[0]["candidate_hash"]]
    if earlier["status"] in ("ok", "incorrect"):
        assert nodes[0]["evaluation_id"] == earlier["evaluation_id"]
        assert "not evaluated again" in nodes[0]["message"] and "not evaluated again" in second.stderr
    else:
        assert nodes[0]["evaluation_id"] != earlier["evaluation_id"]
    # sharing: the first workspace's kernels warm-start a run in another workspace
    bundle = tmp_path / "share.json"
    assert cli("kb", "export", str(bundle), ws=ws).returncode == 0
    ws2 = tmp_path / "ws2"
    imported = cli("kb", "import", str(bundle), ws=ws2)
    # each run's best (one kernel, or two where the runs' near-equal kernels ranked differently)
    from kernelevolve.store.blobs import candidate_hash

    exported = {k["hash"] for k in json.loads(bundle.read_text())["kernels"]}
    bests = {
        candidate_hash(Path(s["best_candidate"]).read_text())
        for s in (cold, warm)
        if s["final_status"] == "ok"
    }
    assert exported == bests and bests
    assert imported.returncode == 0 and f"imported {len(exported)} new kernels" in imported.stdout, (
        imported.stdout
    )
    third = json.loads(cli(*args, ws=ws2).stdout)
    assert third["warm_start"] and "imported from" in third["warm_start"][0]["note"]
