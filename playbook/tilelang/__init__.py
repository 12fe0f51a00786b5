"""The recipes of TileLang targets (`@tilelang.jit` kernels): none yet. Each will be a parse-tree rewrite
of one variable (block_M / block_N / block_K, num_stages, threads, `T.use_swizzle`, `T.Pipelined`'s
stages and order, the pass configs that matter), laid out as the other languages' recipes are."""
