"""LeRobot's flow VLAs (SmolVLA, π0, π0.5) read natively from their checkpoint directories: their
registration (:mod:`.family`), ``config.json`` (:mod:`.config`), the processor files (:mod:`.processor`),
the weights' names (:mod:`.weights`), the networks (:mod:`.modules` picks and builds
:mod:`.smolvla`'s, :mod:`.pi0`'s or :mod:`.pi05`'s), the policy (:mod:`.policy`), its incremental
prefill (:mod:`.incremental`), the fitted 2-step sampler (:mod:`.student`), the CUDA graphs
(:mod:`.cuda_graph`), the directory's layout as written (:mod:`.layout`) and the loader
(:mod:`.checkpoint`)."""
