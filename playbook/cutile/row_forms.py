"""The row kernels cutile-row-chunks recognises and what it writes for them: each whole-row form
(one (1, TILE_N) tile of the row at tile index (row, 0), reduced along axis 1) as the reference
kernels write it, and its chunked form, which loops over the row in (1, CHUNK) tiles carrying its
statistics across chunks; and the `next_power_of_2` helper that sizes the whole-row tile."""

# The whole-row kernels, as the reference kernels write them. Parameter and local names are
# placeholders (matched consistently, one to one); `ct`, `int` and `float` must be what they are.
WHOLE_ROW = {
    "softmax": """
def kernel(x, out, TILE_N: ct.Constant[int]):
    row = ct.bid(0)
    tile = ct.load(x, index=(row, 0), shape=(1, TILE_N), padding_mode=ct.PaddingMode.NEG_INF)
    tile = ct.astype(tile, ct.float32)
    row_max = ct.max(tile, axis=1, keepdims=True)
    num = ct.exp(tile - row_max)
    den = ct.sum(num, axis=1, keepdims=True)
    ct.store(out, index=(row, 0), tile=ct.astype(num / den, out.dtype))
""",
    "rmsnorm": """
def kernel(x, weight, out, n_cols: int, eps: float, TILE_N: ct.Constant[int]):
    row = ct.bid(0)
    tx = ct.astype(ct.load(x, index=(row, 0), shape=(1, TILE_N), padding_mode=ct.PaddingMode.ZERO), ct.float32)
    mean_sq = ct.sum(tx * tx, axis=1, keepdims=True) / n_cols
    rstd = ct.rsqrt(mean_sq + eps)
    tw = ct.astype(ct.load(weight, index=(0, 0), shape=(1, TILE_N), padding_mode=ct.PaddingMode.ZERO), ct.float32)
    y = tx * rstd * tw
    ct.store(out, index=(row, 0), tile=ct.astype(y, out.dtype))
""",
    "layernorm": """
def kernel(x, weight, bias, out, n_cols: int, eps: float, TILE_N: ct.Constant[int]):
    row = ct.bid(0)
    tx = ct.astype(ct.load(x, index=(row, 0), shape=(1, TILE_N), padding_mode=ct.PaddingMode.ZERO), ct.float32)
    mean = ct.sum(tx, axis=1, keepdims=True) / n_cols
    in_row = ct.reshape(ct.arange(TILE_N, dtype=ct.int32) < n_cols, (1, TILE_N))
    centered = ct.where(in_row, tx - mean, ct.zeros((1, TILE_N), dtype=ct.float32))
    var = ct.sum(centered * centered, axis=1, keepdims=True) / n_cols
    rstd = ct.rsqrt(var + eps)
    tw = ct.astype(ct.load(weight, index=(0, 0), shape=(1, TILE_N), padding_mode=ct.PaddingMode.ZERO), ct.float32)
    tb = ct.astype(ct.load(bias, index=(0, 0), shape=(1, TILE_N), padding_mode=ct.PaddingMode.ZERO), ct.float32)
    y = centered * rstd * tw + tb
    ct.store(out, index=(row, 0), tile=ct.astype(y, out.dtype))
""",
    "row_sum": """
def kernel(x, out, TILE_N: ct.Constant[int]):
    row = ct.bid(0)
    tile = ct.load(x, index=(row, 0), shape=(1, TILE_N), padding_mode=ct.PaddingMode.ZERO)
    total = ct.sum(ct.astype(tile, ct.float32), axis=1)
    ct.store(out, index=(row,), tile=ct.astype(total, out.dtype))
""",
}

# The chunked forms, in the placeholder names of WHOLE_ROW (renamed to the kernel's names), with
# TILE_N replaced by CHUNK. Names that are new here must not clash with the kernel's.
CHUNKED = {
    "softmax": """
def kernel(x, out, CHUNK: ct.Constant[int]):
    row = ct.bid(0)
    num_chunks = ct.num_tiles(x, axis=1, shape=(1, CHUNK))
    # pass 1: running max and the sum of exp(x - max), rescaled whenever the max grows (online
    # softmax); columns past the row load as -inf and add exp(-inf) = 0
    row_max = ct.full((1, 1), -math.inf, dtype=ct.float32)
    den = ct.zeros((1, 1), dtype=ct.float32)
    for k in range(num_chunks):
        tile = ct.load(x, index=(row, k), shape=(1, CHUNK), padding_mode=ct.PaddingMode.NEG_INF)
        tile = ct.astype(tile, ct.float32)
        new_max = ct.maximum(row_max, ct.max(tile, axis=1, keepdims=True))
        # while every column so far is -inf, subtract 0 rather than -inf (-inf - -inf is NaN)
        shift = ct.where(new_max == -math.inf, 0.0, new_max)
        den = den * ct.exp(row_max - shift) + ct.sum(ct.exp(tile - shift), axis=1, keepdims=True)
        row_max = new_max
    # pass 2: exp(x - max) / sum per chunk; columns past the row are not stored
    for k in range(num_chunks):
        tile = ct.load(x, index=(row, k), shape=(1, CHUNK), padding_mode=ct.PaddingMode.NEG_INF)
        tile = ct.astype(tile, ct.float32)
        num = ct.exp(tile - row_max)
        ct.store(out, index=(row, k), tile=ct.astype(num / den, out.dtype))
""",
    "rmsnorm": """
def kernel(x, weight, out, n_cols: int, eps: float, CHUNK: ct.Constant[int]):
    row = ct.bid(0)
    num_chunks = ct.num_tiles(x, axis=1, shape=(1, CHUNK))
    # pass 1: sum of squares, column-wise across chunks, reduced once; columns past n_cols load as 0
    sum_sq = ct.zeros((1, CHUNK), dtype=ct.float32)
    for k in range(num_chunks):
        tx = ct.astype(ct.load(x, index=(row, k), shape=(1, CHUNK), padding_mode=ct.PaddingMode.ZERO), ct.float32)
        sum_sq = sum_sq + tx * tx
    mean_sq = ct.sum(sum_sq, axis=1, keepdims=True) / n_cols  # divide by the true width, not the chunks'
    rstd = ct.rsqrt(mean_sq + eps)
    # pass 2: normalise chunk by chunk; columns past n_cols are not stored
    for k in range(num_chunks):
        tx = ct.astype(ct.load(x, index=(row, k), shape=(1, CHUNK), padding_mode=ct.PaddingMode.ZERO), ct.float32)
        tw = ct.astype(ct.load(weight, index=(0, k), shape=(1, CHUNK), padding_mode=ct.PaddingMode.ZERO), ct.float32)
        y = tx * rstd * tw
        ct.store(out, index=(row, k), tile=ct.astype(y, out.dtype))
""",
    "layernorm": """
def kernel(x, weight, bias, out, n_cols: int, eps: float, CHUNK: ct.Constant[int]):
    row = ct.bid(0)
    num_chunks = ct.num_tiles(x, axis=1, shape=(1, CHUNK))
    offs = ct.reshape(ct.arange(CHUNK, dtype=ct.int32), (1, CHUNK))
    # pass 1: mean and sum of squared deviations; each chunk is centred on its own mean, then
    # merged with the running pair (Chan et al.), so there is no E[x^2] - E[x]^2 cancellation
    mean = ct.zeros((1, 1), dtype=ct.float32)
    m2 = ct.zeros((1, 1), dtype=ct.float32)
    for k in range(num_chunks):
        # columns past n_cols load as 0; they are masked out of the chunk's deviations
        tx = ct.astype(ct.load(x, index=(row, k), shape=(1, CHUNK), padding_mode=ct.PaddingMode.ZERO), ct.float32)
        seen = k * CHUNK  # columns merged so far: every chunk before the last is full
        n_k = min(CHUNK, n_cols - seen)
        mean_k = ct.sum(tx, axis=1, keepdims=True) / n_k
        in_row = offs + seen < n_cols
        centered = ct.where(in_row, tx - mean_k, ct.zeros((1, CHUNK), dtype=ct.float32))
        delta = mean_k - mean
        mean = mean + delta * n_k / (seen + n_k)
        m2 = m2 + ct.sum(centered * centered, axis=1, keepdims=True) + delta * delta * seen * n_k / (seen + n_k)
    var = m2 / n_cols
    rstd = ct.rsqrt(var + eps)
    # pass 2: normalise chunk by chunk; columns past n_cols are not stored
    for k in range(num_chunks):
        tx = ct.astype(ct.load(x, index=(row, k), shape=(1, CHUNK), padding_mode=ct.PaddingMode.ZERO), ct.float32)
        tw = ct.astype(ct.load(weight, index=(0, k), shape=(1, CHUNK), padding_mode=ct.PaddingMode.ZERO), ct.float32)
        tb = ct.astype(ct.load(bias, index=(0, k), shape=(1, CHUNK), padding_mode=ct.PaddingMode.ZERO), ct.float32)
        y = (tx - mean) * rstd * tw + tb
        ct.store(out, index=(row, k), tile=ct.astype(y, out.dtype))
""",
    "row_sum": """
def kernel(x, out, CHUNK: ct.Constant[int]):
    row = ct.bid(0)
    # column-wise partial sums across chunks, reduced once; columns past the row load as 0
    acc = ct.zeros((1, CHUNK), dtype=ct.float32)
    for k in range(ct.num_tiles(x, axis=1, shape=(1, CHUNK))):
        tile = ct.load(x, index=(row, k), shape=(1, CHUNK), padding_mode=ct.PaddingMode.ZERO)
        acc = acc + ct.astype(tile, ct.float32)
    total = ct.sum(acc, axis=1)
    ct.store(out, index=(row,), tile=ct.astype(total, out.dtype))
""",
}

NEXT_POW2 = """
def f(n):
    return 1 << (n - 1).bit_length()
"""
TEMPLATE_FREE = ("ct", "int", "float")  # names the templates read without binding them
NEW_FREE = ("math", "range", "min")  # names the chunked forms read from the module or builtins
