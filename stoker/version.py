"""stoker's version, in one place: the package, the CLI and pyproject.toml read it from here."""

__version__ = "0.1.0"
