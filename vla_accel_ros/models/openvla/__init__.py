"""OpenVLA as published (openvla-7b and its fine-tunes), loaded natively from its own directory:
its registration (:mod:`.family`), the directory's JSON (:mod:`.config`), the vision towers and
projector (:mod:`.vision`), the model half of the token-VLA passes it shares with the Hugging Face
family (:mod:`.modules`), the memory-mapped weights and their names (:mod:`.weights`), the policy
(:mod:`.policy`) and the loader (:mod:`.checkpoint`)."""
