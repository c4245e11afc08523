"""The search: a tree of candidates grown by one operator, selected by a policy, stopped by limits.

tree.py      the run's nodes as a tree: ancestry, siblings, the best under the noise rule
policies.py  greedy, UCT, evolutionary: which node(s) to expand next
memory.py    which memory mode an expansion gets, and the history that mode shows
limits.py    candidate, wall-clock, token and USD budgets, stall patience, target speedup
engine.py    the loop: select, synthesize, evaluate, record; resume; the final re-measurement
"""
