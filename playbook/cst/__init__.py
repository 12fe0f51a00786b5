"""The libcst machinery the recipes of both languages share.

Recipes recognise their pattern structurally (libcst nodes, resolved scopes), never by regex on
source text. A recipe that meets something it does not understand raises `Skip` and proposes
nothing; the message says why.

* `source`: parsing a target, checking a rewrite, printing and walking nodes, `Skip`;
* `names`: which names code reads and binds, and what it binds them to;
* `aliases`: the module's import aliases of triton, triton.language and cuda.tile, calls through them;
* `imports`: the module's other imports (torch, functools, os, ...);
* `kernels`: @triton.jit and @ct.kernel functions, their decorators and parameters;
* `launches`: `kernel[grid](...)` launches of Triton kernels and the arguments they bind;
* `launch_values`: what each launch keyword is worth: literal, constant, a wrapper's literal, or computed;
* `memory`: a kernel's loads and stores and the parameter each addresses (`+=`, block pointers, descriptors);
* `program`: kernels and device helpers, host code, and the kernels the entry point's forward path launches;
* `entry`: the entry point a spec names (ENTRY, or what an entry adapter reads of the target);
* `constants`: module-level int constants: reading, setting, adding and dropping them;
* `edits`: rewriting nodes in place: replacement by identity, keyword arguments, layout;
* `templates`: matching a function against a template up to a renaming of its names.
"""
