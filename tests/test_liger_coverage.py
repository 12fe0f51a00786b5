"""Launch coverage on code this project did not write: the playbook's persistent rewrite of Liger-Kernel's
softmax backward kernel (asked for from the backward host function, as an agent's edit of it would be;
the playbook itself leaves a kernel off the forward path alone), tested while the forward op is tuned,
touches only code the forward entry never runs (the backward kernel, the host function launching it, a new helper, and declarations the
rewrite adds at module level: `import functools`, `PROGRAMS_PER_SM = 16`). It is `unexercised`, not
timed as a change: an interpreter run of the unattended loop once recorded it as within noise."""

from __future__ import annotations

import playbook
from playbook.analysis import analyze

from loop.target.coverage import touched, unexercised

# what the checks of Liger's softmax forward, through its autograd Function, record
LAUNCHED = ["_softmax_single_block_forward_kernel"]
CALLED = ["LigerSoftmaxFunction.forward", "_softmax_forward"]


def test_a_rewrite_of_the_backward_path_is_unexercised_by_the_forward_checks(liger_kernel):
    source = (liger_kernel / "ops" / "softmax.py").read_text()
    found = playbook.get("triton-persistent").candidates(source, analyze(source, entry=("_softmax_backward",)))
    backward = next(c for c in found if c.key == "triton-persistent:_softmax_single_block_backward_kernel")
    changed, elsewhere = touched(source, backward.source)
    assert "_softmax_single_block_backward_kernel" in changed and "_softmax_backward" in changed
    assert not elsewhere, "the module-level lines it adds are declarations for the rewritten functions"
    assert "import functools" in backward.source and "PROGRAMS_PER_SM = " in backward.source
    assert set(unexercised(source, backward.source, LAUNCHED, CALLED)) >= {"_softmax_single_block_backward_kernel",
                                                                            "_softmax_backward"}
    # the same declarations with a change of the forward kernel: that one runs in the checks
    forward = backward.source.replace("e = tl.exp(x - m)", "e = tl.exp(x - m) * 1.0", 1)
    assert forward != backward.source
    assert unexercised(source, forward, LAUNCHED, CALLED) == []
