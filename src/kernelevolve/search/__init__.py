"""The search: a tree of candidates grown by one operator, selected by a policy, stopped by limits.

tree.py       the run's nodes as a tree: ancestry, siblings, the best under the noise rule
policies.py   greedy, UCT, evolutionary: which node(s) to expand next
memory.py     which memory mode an expansion gets, and the history that mode shows
context.py    what an engine is given: the run's workspace, spec, platform, settings; its events
limits.py     candidate, wall-clock, token and USD budgets, stall patience, target speedup
tasks.py      what a node is given: its parents and memory mode, then its task (context, knowledge)
learning.py   what a run learns as it goes: analyses, lessons, retrieval signals, skills, warm starts
profiling.py  profiles of a run's new bests, taken beside the search
tools.py      the tools a synthesizer may use; the run lock; the dispatch table
engine.py     the loop: select, synthesize, evaluate, record; resume
finish.py     the end of a run: the winners re-measured, skills verified, export, report
"""
