"""The seeds of the simulated pick task: demonstrations are recorded on seeds below
:data:`EVAL_SEED_START`, and every evaluation starts there, so that it runs on held-out scenes.
Importable without MuJoCo (the commands' ``--help`` shows it)."""

EVAL_SEED_START = 100_000
