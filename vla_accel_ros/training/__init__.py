"""Training: the demonstration data set, shared training helpers, and one trainer per component (target
VLA, parallel draft head, continuous action head, world-aware prefill, HeiSD retrieval store)."""
