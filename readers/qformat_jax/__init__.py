"""qformat for JAX (the JAX reader arrives with the readers issue)."""
