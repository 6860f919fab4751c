"""Reader scripts of ``stoker bench loader``; each runs as a script in a fresh process (see _epochs.py)."""
