"""The recipes of CUDA C targets (`.cu` files with `extern "C" void solve(...)`): each a rewrite of one
variable on the file's tree-sitter parse (`loop.common.cuda_tree`), made as byte-range edits so the
rest of the file stays as written. `sites` and `element_loop` hold what several recipes read: the
kernels on solve's path, where a launch's block size is written, a kernel's pointers and what it
does through them, and the element loop of an element-wise kernel."""
