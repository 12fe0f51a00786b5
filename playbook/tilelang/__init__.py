"""The recipes of TileLang targets (`@tilelang.jit` kernels), one module per recipe with its page beside it:
block sizes (`block_size`), the pipelining depth of `T.Pipelined` (`num_stages`), the threads of `T.Kernel`
(`threads`), rasterization (`swizzle`) and the pass configs that matter (`pass_configs`); what they read of
a target and how they set a value (`program`), and the bounds a tile is held to (`budget`). They are
libcst rewrites of the source: tilelang itself is never imported here."""
