"""The dump: a recording on disk, written step by step and read back as untrusted input (the format,
its manifest's schema, the JSON encoding of events, the safetensors payloads, the writer and reader).
The rest of :mod:`nbdiff.trace` records and never imports it."""
