"""LeRobot's flow VLAs (SmolVLA, π0, π0.5) read natively from their checkpoint directories."""
