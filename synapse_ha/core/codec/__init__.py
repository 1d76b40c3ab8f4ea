"""Encodings: the versioned, canonical encoding of commands and of the whole state, the
format gate, and the backup file."""
