"""The run lifecycle: a `Run` (core.py) and one iteration value carried by named stage functions
(propose -> apply -> commit -> verify -> measure -> decide -> record -> finish, iteration.py), init
(branch + baseline), the unattended loop, resume, and the run's state. `experiment.py` says which
module owns which part."""
