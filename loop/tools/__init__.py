"""Tools that examine a kernel or a machine outside an iteration: doctor, compile, compare, profile
(Nsight Compute), decision-check, and the final measurement against PyTorch for `report --measure`."""
