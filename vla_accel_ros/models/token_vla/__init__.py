"""What every token VLA shares (the Llava-style Hugging Face family, OpenVLA, OpenVLA-OFT): the spec
(:mod:`.spec`), the action statistics and the action tokenizer (:mod:`.statistics`), the checks of
their files that need no model (:mod:`.checks`), the passes over prompts and images (:mod:`.passes`),
the policy the token decoders drive (:mod:`.policy`), its KV cache (:mod:`.cache`), its incremental
prefill (:mod:`.incremental`) and its EAGLE-style draft head (:mod:`.draft`)."""
