"""How a node reads in a prompt: its numbers, its verdict, its diagnosis, what separated it from its
siblings. Shared by the prompt builder (`prompt.py`), the CLI (`kernelevolve profile` prints a
diagnosis the way a model sees it) and anything else that shows a node to a reader.
"""

from __future__ import annotations

from typing import Any

from kernelevolve.synth.base import NodeView


def clip(text: str, max_chars: int, what: str = "lines") -> str:
    """`text` within about `max_chars`: head and tail kept, the middle elided with a marker."""
    if len(text) <= max_chars:
        return text
    lines = text.splitlines()
    head: list[str] = []
    tail: list[str] = []
    used = 0
    budget_head, budget_tail = max_chars * 2 // 3, max_chars // 3
    for line in lines:
        if used + len(line) + 1 > budget_head:
            break
        head.append(line)
        used += len(line) + 1
    used = 0
    for line in reversed(lines[len(head) :]):
        if used + len(line) + 1 > budget_tail:
            break
        tail.insert(0, line)
        used += len(line) + 1
    if not head and not tail:  # one enormous line
        return (
            text[:budget_head]
            + f"\n[... {len(text) - max_chars} characters elided ...]\n"
            + text[-budget_tail:]
        )
    elided = len(lines) - len(head) - len(tail)
    return "\n".join([*head, f"# [... {elided} {what} elided to fit the prompt ...]", *tail])


def fmt(x: Any) -> str:
    if isinstance(x, float):
        return f"{x:.3g}"
    return str(x)


def speed_text(n: NodeView) -> str:
    """Speedups, the one fitness ranks by first: against the best baseline (the faster one)."""
    parts = []
    if n.speedup_vs_best is not None:
        parts.append(
            f"{n.speedup_vs_best:.2f}x vs {n.best_baseline or 'the best baseline'} (the faster baseline)"
        )
    if n.speedup_vs_eager is not None:
        parts.append(f"{n.speedup_vs_eager:.2f}x vs eager")
    if n.speedup_vs_compile is not None:
        parts.append(f"{n.speedup_vs_compile:.2f}x vs compile")
    if n.spread is not None:
        parts.append(f"noise ±{100 * n.spread:.1f}%")
    if n.roofline_fraction is not None:
        parts.append(f"{100 * n.roofline_fraction:.0f}% of roofline")
    return ", ".join(parts)


def bound_of(n: NodeView) -> str | None:
    if n.diagnosis and n.diagnosis.get("bound"):
        return str(n.diagnosis["bound"])
    bounds = {s.get("bound") for s in n.shapes if s.get("bound")}
    return "/".join(sorted(str(b) for b in bounds)) or None


def node_line(n: NodeView, parent_fitness: dict[int, float]) -> str:
    status = n.status or "not evaluated"
    line = f"- #{n.id} [{n.mode}] {status}"
    if n.status == "ok":
        line += f", fitness {n.fitness:.2f}"
        if n.parent in parent_fitness and parent_fitness[n.parent] > 0:
            line += f" ({n.fitness / parent_fitness[n.parent]:.2f}x its parent #{n.parent})"
        speed = speed_text(n)
        if speed:
            line += f"; {speed}"
        bound = bound_of(n)
        if bound:
            line += f"; {bound}-bound"
    elif n.message:
        first = n.message.strip().splitlines()[0] if n.message.strip() else ""
        line += f": {first[:200]}"
    if n.analysis:
        line += f"\n  analysis: {n.analysis.strip()[:400]}"
    elif n.note:
        line += f"\n  changed: {n.note.strip()[:300]}"
    if n.config:
        line += f"\n  config: {n.config}"
    return line


def diagnosis_text(d: dict[str, Any]) -> str:
    """A diagnosis as a prompt section: class and summary, the evidence numbers, the directives."""
    lines = [f"diagnosis: {d.get('summary') or d.get('class')}"]
    evidence = []
    for e in d.get("evidence") or []:
        if "shape" in e:
            frac = e.get("roofline_fraction")
            evidence.append(
                f"{e['shape']} {e.get('time_us')} us"
                + (f" ({100 * frac:.0f}% of roofline)" if frac is not None else "")
            )
        else:
            evidence.append(f"{e.get('ncu') or e.get('profiler')} = {fmt(e.get('value'))}")
    if evidence:
        lines.append("evidence: " + "; ".join(evidence))
    for directive in d.get("directives") or []:
        lines.append(f"- {directive}")
    return "\n".join(lines)


def verdict_text(n: NodeView, message_chars: int) -> str:
    out = [f"status: {n.status or 'not evaluated'}"]
    if n.status == "ok":
        out.append(f"fitness {n.fitness:.3f}; {speed_text(n)}")
    for s in n.shapes:
        items = ", ".join(f"{k}={fmt(v)}" for k, v in s.items() if k != "name" and v is not None)
        out.append(f"shape {s.get('name', '?')}: {items}")
    if n.diagnosis:
        out.append(diagnosis_text(n.diagnosis))
    if n.analysis:
        out.append(f"analysis: {n.analysis}")
    if n.config:
        out.append(f"config: {n.config}")
    if n.message and n.status != "ok":
        out.append(f"what the harness said:\n```\n{clip(n.message.strip(), message_chars)}\n```")
    elif n.message:
        out.append(f"harness note: {clip(n.message.strip(), 500)}")
    return "\n".join(out)


def contrast(nodes: list[NodeView]) -> str:
    """One paragraph on what separated the fastest sibling from the slowest, and how others failed."""
    ok = [n for n in nodes if n.status == "ok"]
    failed: dict[str, int] = {}
    for n in nodes:
        if n.status and n.status != "ok":
            failed[n.status] = failed.get(n.status, 0) + 1
    lines = []
    if len(ok) >= 2:
        fast, slow = ok[0], ok[-1]
        lines.append(
            f"Fastest #{fast.id} ({fast.fitness:.2f}) against slowest #{slow.id} ({slow.fitness:.2f})."
        )
        if fast.config and slow.config:
            diff = {k: (slow.config.get(k), v) for k, v in fast.config.items() if slow.config.get(k) != v}
            if diff:
                lines.append(
                    "Config differences (slow -> fast): "
                    + ", ".join(f"{k} {a} -> {b}" for k, (a, b) in diff.items())
                    + "."
                )
        fb, sb = bound_of(fast), bound_of(slow)
        if fb and sb and fb != sb:
            lines.append(f"The fastest is {fb}-bound, the slowest {sb}-bound.")
    if failed:
        lines.append("Failures: " + ", ".join(f"{k} x{v}" for k, v in sorted(failed.items())) + ".")
    return ("\nWhat separated them: " + " ".join(lines)) if lines else ""


__all__ = ["bound_of", "clip", "contrast", "diagnosis_text", "fmt", "node_line", "speed_text", "verdict_text"]
