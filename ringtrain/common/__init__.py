"""What every part of ringtrain uses, and nothing else: one-line errors and
exit codes, and how a command reads its flags. Imports nothing of ringtrain."""
