"""Reports of optimization runs: `write_report(run, nodes, out_dir)` writes report.md and a
self-contained report.html (inline CSS and SVG, no scripts) from the store's plain dicts.

`run` is the run's row: run_id, spec_name, spec_path, platform, device, synthesizer, policy, status,
created_at (ISO), limits, config, best_node, tokens_in, tokens_out, cost_usd, wall_s, method (a
`Verdict.method` dict, may be empty), final (the best's re-measured `Verdict.to_dict()`, or None) and
baseline ("eager" | "compile"). `nodes` are the run's nodes in creation order: id, parent, parent2,
mode, state, status, fitness, speedup_vs_eager, speedup_vs_compile, note, message, source, verdict,
tokens_in, tokens_out, cost_usd, synth_s, eval_s, created_at. Any field may be missing or None.
"""

from kernelevolve.report.render import write_report

__all__ = ["write_report"]
