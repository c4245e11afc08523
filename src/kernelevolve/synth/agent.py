"""The synthesizer of a run driven from outside (`kernelevolve agent ...`, the MCP server): any coding
agent, or a person, is the operator. The engine never asks it for a proposal; the agent jobs
(`kernelevolve.agent_jobs`: next task, submit, finish) hand out tasks and record submissions.
"""

from __future__ import annotations

from kernelevolve.synth.base import Proposal, Task, Tools


class ExternalAgent:
    """The synthesizer of an `agent` run: the engine never asks it; `next_task`/`submit` do the work."""

    name = "agent"

    def propose(self, task: Task, tools: Tools) -> Proposal:
        return Proposal(source=None, error="an agent run's candidates come from `kernelevolve agent submit`")


__all__ = ["ExternalAgent"]
