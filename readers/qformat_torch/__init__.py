"""qformat for PyTorch (the torch reader arrives with the readers issue)."""
