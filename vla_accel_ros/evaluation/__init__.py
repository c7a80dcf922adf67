"""Closed-loop evaluation in the MuJoCo sim: episodes through the runner, the decoder bench, vision
fidelity and sim throughput."""
