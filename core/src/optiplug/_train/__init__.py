"""The ``optiplug train`` application: a small transformer trained on a real corpus.

An application built on the public API; it registers its command through the
``optiplug_cli_commands`` hook like any plugin would.
"""
