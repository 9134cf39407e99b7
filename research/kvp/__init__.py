"""KVP: learned eviction scorers (collection of training data, training, benchmark)."""
