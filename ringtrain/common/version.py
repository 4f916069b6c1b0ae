"""ringtrain's version: one place, read by setup.cfg, --version and doctor."""
__version__ = "0.1.0"
