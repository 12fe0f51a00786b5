"""The playbook: what an iteration may change in a kernel, as checked source rewrites.

A recipe is a class with `id`, `title`, `languages`, `applies(analysis)` and
`candidates(source, analysis)`; each candidate changes one variable and carries a hypothesis.
"""

from playbook.base import Candidate, Recipe, get, next_candidate, recipes

__all__ = ["Candidate", "Recipe", "get", "next_candidate", "recipes"]
