"""The playbook: what an iteration may change in a kernel, as checked source rewrites.

A recipe is a class with `id`, `title`, `languages`, `applies(analysis)` and
`candidates(source, analysis)`; each candidate changes one variable and carries a hypothesis.
playbook.triton and playbook.cutile hold the recipes of each language, one module per recipe
with its page beside it; playbook.cst the libcst machinery they share.
"""

from playbook.base import get, next_candidate, recipes
from playbook.recipe import Candidate, Recipe

__all__ = ["Candidate", "Recipe", "get", "next_candidate", "recipes"]
