"""LeRobot's flow VLAs (SmolVLA, π0) read natively from their checkpoint directories."""
