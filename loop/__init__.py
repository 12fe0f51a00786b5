"""tileloop: tune one GPU kernel by disciplined experiment.

The package is the trusted side of the experiment: it checks, times, decides and records.
Kernel code is only ever imported by `loop.worker`, in a fresh subprocess.
"""

__version__ = "0.1.0"
