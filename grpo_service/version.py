"""The package's version: one tiny module, so that anything may import it without loading the app."""

__version__ = "0.1.0"
