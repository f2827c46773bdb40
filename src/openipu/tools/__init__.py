"""Command-line tools (the gc-* tools on simulated IPUs)."""
