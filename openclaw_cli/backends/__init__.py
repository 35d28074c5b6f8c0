"""Built-in backends. Each is registered under the ``openclaw.backends`` entry-point group in pyproject.toml."""
