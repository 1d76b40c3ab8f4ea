"""The job spec: the document's fields, how their values are written, and the one rule
set they obey."""
