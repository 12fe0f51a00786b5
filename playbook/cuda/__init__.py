"""The recipes of CUDA C targets (`.cu` files with `extern "C" void solve(...)`): none yet. Each will be a
parse-tree rewrite of one variable (threads per block, a grid-stride loop, vectorised loads,
`__launch_bounds__`, ...), laid out as the other languages' recipes are."""
