"""The qformat conformance corpus: its generator, its independent spec transcription, its runner
lives in qformat/conformance.py."""
