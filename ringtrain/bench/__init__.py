"""ringtrain-bench: measured ring-versus-PS scaling tables and allreduce bandwidth.

Columns are defined once, in bench/COLUMNS.md; the tables print a pointer to it.
"""
