"""Requests: (context, continuation) pairs tokenized into flat tables (`pairs`), and the on-disk request
cache (`cache`)."""
