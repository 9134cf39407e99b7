"""Long-context fidelity: a RULER-style synthetic suite (generator.py) and its bench (run.py)."""
