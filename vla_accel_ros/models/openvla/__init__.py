"""OpenVLA as published (openvla-7b and its fine-tunes), loaded natively from its own directory:
the loader (:mod:`.checkpoint`), the directory's JSON (:mod:`.config`), the memory-mapped weights and
their names (:mod:`.weights`), the vision towers and projector (:mod:`.vision`) and the model half of
the token-VLA passes it shares with the Llava family (:mod:`.modules`)."""
