"""Helpers for tests and benchmarks: a tiny offline model and tokenizer. Not used by the product at run time."""
